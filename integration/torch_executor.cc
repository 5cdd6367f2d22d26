// TorchExecutor: see torch_executor.h for the contract.
#include "integration/torch_executor.h"

#include <ATen/core/List.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "integration/memory_events.h"
#include "integration/op_capture.h"
#include "integration/out_of_memory.h"
#include "integration/storage_eviction.h"

namespace remat::integration {
namespace {

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using Substitutions = absl::flat_hash_map<const c10::StorageImpl*, c10::intrusive_ptr<c10::StorageImpl>>;

void Substitute(const at::Tensor& tensor, const Substitutions& subst) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  auto it = subst.find(tensor.storage().unsafeGetStorageImpl());
  if (it == subst.end() || it->second.get() == tensor.storage().unsafeGetStorageImpl()) return;
  tensor.unsafeGetTensorImpl()->set_storage_keep_dtype(c10::Storage(it->second));
}

void SubstituteValue(const c10::IValue& value, const Substitutions& subst) {
  if (value.isTensor()) {
    Substitute(value.toTensor(), subst);
  } else if (value.isTensorList()) {
    for (const at::Tensor& tensor : value.toTensorList()) Substitute(tensor, subst);
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toList()) SubstituteValue(element, subst);
  }
}

// The op's returned tensors with a strided storage, in the order CaptureOutputs records them.
std::vector<at::Tensor> ReturnedTensors(const c10::Stack& stack, std::size_t num_returns) {
  std::vector<at::Tensor> out;
  const std::size_t first = stack.size() - num_returns;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && StridedOverStorage(t)) out.push_back(t);
  };
  for (std::size_t r = 0; r < num_returns; ++r) ForEachTensor(stack[first + r], add);
  return out;
}

}  // namespace

void TorchExecutor::Grow(StorageIndex s) {
  if (s >= homes_.size()) {
    homes_.resize(s + 1, c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>()));
    shadows_.resize(s + 1);
    paged_evictable_.resize(s + 1, true);
  }
}

void TorchExecutor::AddOp(OpId op, std::unique_ptr<ReplayOp> replay) {
  if (op >= ops_.size()) ops_.resize(op + 1);
  ops_[op] = std::move(replay);
}

void TorchExecutor::SetHome(StorageIndex s, const c10::intrusive_ptr<c10::StorageImpl>& home) {
  Grow(s);
  homes_[s] = c10::weak_intrusive_ptr<c10::StorageImpl>(home);
  shadows_[s].reset();
}

void TorchExecutor::ClearHome(StorageIndex s) {
  Grow(s);
  homes_[s] = c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>());
}

c10::intrusive_ptr<c10::StorageImpl> TorchExecutor::Holder(StorageIndex s) const {
  if (s >= homes_.size()) return {};
  if (shadows_[s]) return shadows_[s];
  c10::intrusive_ptr<c10::StorageImpl> home = homes_[s].lock();
  if (home && IsEvicted(*home)) return {};
  return home;
}

void TorchExecutor::SetOwner(std::uintptr_t address, StorageIndex s, bool evictable) {
  Arena* arena = memory_->arena();
  if (arena == nullptr || address == 0) return;
  (void)arena->SetOwner(address, evictable ? static_cast<OwnerId>(s) + 1 : kNoOwner);  // not ours: NotFound
}

absl::Status TorchExecutor::Deliver(Engine& engine, StorageIndex s,
                                    const c10::intrusive_ptr<c10::StorageImpl>& source, bool copy, bool evictable) {
  c10::intrusive_ptr<c10::StorageImpl> memory = copy ? CopyStorage(*memory_, *source) : source;
  Grow(s);
  c10::intrusive_ptr<c10::StorageImpl> home = homes_[s].lock();
  std::uintptr_t address = 0;
  if (home && IsEvicted(*home)) {
    const std::size_t nbytes = static_cast<std::size_t>(engine.StorageBytes(s));
    if (absl::Status status = RestoreStorage(*home, nbytes, *memory); !status.ok()) return status;
    address = reinterpret_cast<std::uintptr_t>(home->_mutable_data_ptr_no_checks().get());
  } else {
    // No user StorageImpl wants these bytes (an old version, or the home died): keep them privately.
    homes_[s] = c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>());
    shadows_[s] = memory;
    ++stats_.shadows;
    address = reinterpret_cast<std::uintptr_t>(memory->_mutable_data_ptr_no_checks().get());
  }
  engine.SetAddress(s, address);
  SetOwner(address, s, evictable);
  return absl::OkStatus();
}

absl::Status TorchExecutor::Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) {
  // The engine is not exception-safe: every torch error (an allocation that does not fit, a kernel error) becomes
  // a status here.
  if (!deferred_error_.ok()) return std::exchange(deferred_error_, absl::OkStatus());  // a failed WillRead
  try {
    return ExecuteOrThrow(engine, op, replay, fresh);
  } catch (const std::exception& e) {
    // A kernel written in Python (remat::compiled_graph's, remat/_compile.py) that ran out of memory throws
    // pybind11's error_already_set, whose what() is "<Python type>: <message>".
    constexpr absl::string_view kPythonOutOfMemory = "OutOfMemoryError: ";
    if (absl::StartsWith(e.what(), kPythonOutOfMemory)) {
      return absl::ResourceExhaustedError(absl::string_view(e.what()).substr(kPythonOutOfMemory.size()));
    }
    if (IsOutOfMemory(e)) return absl::ResourceExhaustedError(MessageOf(e));  // also untyped ones: out_of_memory.h
    return absl::InternalError(absl::StrCat("remat: replay failed: ", MessageOf(e)));
  }
}

absl::Status TorchExecutor::ExecuteOrThrow(Engine& engine, OpId op, bool replay,
                                           std::span<const std::uint32_t> fresh) {
  if (op >= ops_.size() || ops_[op] == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "remat: cannot recompute the output of '", std::string(engine.OpName(op)),
        "': it was not recorded as replayable (a constant that was overwritten or freed, or an op with side "
        "effects)"));
  }
  (void)replay;  // first executions run in the user's thread (BeginOp/EndOp); everything here is a replay
  const std::int64_t start = NowNs();
  const MemoryEventScope history(ops_[op]->record.traits->name, /*op=*/true, /*replay=*/true);
  struct ClearInUse {
    std::vector<const c10::StorageImpl*>* in_use;
    ~ClearInUse() { in_use->clear(); }
  } clear_in_use{&in_use_};
  ReplayOp& r = *ops_[op];
  const OpRecord& record = r.record;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> holders(record.input_storages.size());
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> scratch(record.input_storages.size());
  // Gathers the inputs (private copies of written ones, fresh buffers for overwritten ones) and runs the op. It
  // writes nothing the user sees, so it can run again when it runs out of memory.
  auto attempt = [&]() -> absl::StatusOr<c10::Stack> {
    Substitutions subst;
    for (std::size_t k = 0; k < record.input_storages.size(); ++k) {
      if (!r.overwritten.empty() && r.overwritten[k]) {  // its old contents do not matter
        const StorageIndex s = r.in_place_storage(static_cast<int>(k));
        if (s == kNoIndex) return absl::InternalError("remat: an overwritten argument without a new value");
        scratch[k] = memory_->NewStorage(static_cast<std::size_t>(engine.StorageBytes(s)));
        subst[record.input_storages[k].get()] = scratch[k];
        continue;
      }
      if (r.inputs[k] == kNoIndex) {
        // A constant the op writes on the side, which its outputs ignore (op_effects.h, 3): fresh memory (what
        // the kernel writes into it from its old bytes is thrown away with it).
        scratch[k] = memory_->NewStorage(r.side_written_bytes(static_cast<int>(k)));
        subst[record.input_storages[k].get()] = scratch[k];
        continue;
      }
      c10::intrusive_ptr<c10::StorageImpl> holder = Holder(engine.StorageOf(r.inputs[k]));
      if (!holder || IsEvicted(*holder)) {
        return absl::InternalError(absl::StrCat("remat: replay of ", record.traits->name, ": input ", k,
                                                " is not resident"));
      }
      holders[k] = holder;
      in_use_.push_back(holder.get());
      if (r.written[k]) {
        scratch[k] = CopyStorage(*memory_, *holder);
        subst[record.input_storages[k].get()] = scratch[k];
      } else {
        subst[record.input_storages[k].get()] = holder;
      }
    }
    c10::Stack arguments = ReplayArguments(record);
    for (const c10::IValue& value : arguments) SubstituteValue(value, subst);
    EngineLock::LendScope lend(lock_);  // the kernel's allocations may make room from any thread
    return ReplayWith(record, std::move(arguments));
  };
  absl::StatusOr<c10::Stack> result = absl::UnknownError("remat: the replay did not run");
  for (int retries = 0;; ++retries) {
    bool out_of_memory = false;
    try {
      result = attempt();
      out_of_memory = !result.ok() && absl::IsResourceExhausted(result.status());
    } catch (const c10::OutOfMemoryError& e) {
      result = absl::ResourceExhaustedError(e.what_without_backtrace());
      out_of_memory = true;
    }
    if (!out_of_memory || retries == kMaxOutOfMemoryRetries) break;
    // Nothing uses the inputs until the next attempt: they may move out of the way (Engine::MakeHoleForRetry).
    in_use_.clear();
    for (auto& h : holders) h.reset();
    for (auto& c : scratch) c.reset();
    absl::StatusOr<bool> hole = engine.MakeHoleForRetry();
    if (!hole.ok()) return hole.status();  // a failed move: the cause, not the out-of-memory it was for
    if (!*hole) break;
    ++stats_.retried_replays;
  }
  if (!result.ok()) return result.status();
  const std::vector<at::Tensor> returned = ReturnedTensors(*result, record.op.schema().returns().size());
  if (returned.size() != record.outputs.size()) {
    return absl::InternalError(absl::StrCat("remat: replay of ", record.traits->name, " returned ",
                                            returned.size(), " tensors, the recorded run ", record.outputs.size()));
  }
  for (const std::uint32_t s : fresh) {
    bool delivered = false;
    for (std::size_t i = 0; i < r.output_storage.size() && !delivered; ++i) {
      if (r.output_storage[i] != s) continue;
      c10::StorageImpl* impl = returned[i].storage().unsafeGetStorageImpl();
      bool is_input = false;
      for (const auto& h : holders) is_input = is_input || h.get() == impl;
      for (const auto& c : scratch) is_input = is_input || c.get() == impl;
      if (absl::Status status =
              Deliver(engine, s, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl), is_input);
          !status.ok()) {
        return status;
      }
      delivered = true;
    }
    for (const auto& [k, storage] : r.in_place) {
      if (delivered || storage != s) continue;
      if (absl::Status status = Deliver(engine, s, scratch[k], /*copy=*/false); !status.ok()) return status;
      delivered = true;
    }
    if (!delivered) {
      return absl::InternalError(absl::StrCat("remat: replay of ", record.traits->name, " does not produce storage ",
                                              s));
    }
    RecordMemoryEvent(MemoryEventKind::kRematerialize, engine.StorageAddress(s),
                      static_cast<std::uint64_t>(engine.StorageBytes(s)), s, memory_->history_device());
  }
  ++stats_.replays;
  stats_.replay_ns += NowNs() - start;
  return absl::OkStatus();
}

void TorchExecutor::Evict(Engine& engine, std::uint32_t s) {
  if (s >= homes_.size()) return;
  WillRead(engine, s);  // a prefetched block is freed only after the current stream is ordered after its copy
  // A storage the program still refers to is evicted; one it let go of is just freed (a release).
  const bool released = engine.StorageExternalRefs(s) == 0;
  if (MemoryHistoryEnabled()) {
    RecordMemoryEvent(released ? MemoryEventKind::kRelease : MemoryEventKind::kEvict, engine.StorageAddress(s),
                      static_cast<std::uint64_t>(engine.StorageBytes(s)), s, memory_->history_device());
  }
  const MemoryEventScope history(released ? "remat: free released" : "remat: evict", /*op=*/false);
  if (shadows_[s]) {
    shadows_[s].reset();  // frees its memory: nobody else holds a shadow
    ++stats_.evictions;
    return;
  }
  c10::intrusive_ptr<c10::StorageImpl> home = homes_[s].lock();
  if (!home || IsEvicted(*home) || home->nbytes() == 0) {  // died or already gone
    ++stats_.empty_evictions;
    return;
  }
  if (EvictStorage(*home).ok()) {
    ++stats_.evictions;
  } else {
    ++stats_.empty_evictions;
  }
}

absl::Status TorchExecutor::PageOut(Engine& engine, std::uint32_t s) {
  if (tier_ == nullptr) return Executor::PageOut(engine, s);
  if (!deferred_error_.ok()) return std::exchange(deferred_error_, absl::OkStatus());
  const std::int64_t start = NowNs();
  Grow(s);
  DevicePager* pager = memory_->pager();
  if (absl::Status settled = SettlePageIn(s); !settled.ok()) return settled;  // a prefetch's copy comes first
  c10::intrusive_ptr<c10::StorageImpl> holder = Holder(s);
  // Its last holder died before the bridge's sweep told the engine: nothing to copy (executor.h: NotFound).
  if (!holder) return absl::NotFoundError(absl::StrCat("remat: page-out of storage ", s, ": its bytes are gone"));
  const auto nbytes = static_cast<std::size_t>(engine.StorageBytes(s));
  if (holder->nbytes() != nbytes || holder->sym_nbytes().is_heap_allocated()) {
    return absl::FailedPreconditionError(absl::StrCat("remat: page-out of storage ", s, ": it holds ",
                                                      holder->nbytes(), " bytes, the engine knows ", nbytes));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(holder->_mutable_data_ptr_no_checks().get());
  bool evictable = true;
  if (Arena* arena = memory_->arena(); arena != nullptr) {
    absl::StatusOr<BlockInfo> block = arena->Block(address);
    evictable = !block.ok() || block->owner != kNoOwner;
  }
  const void* bytes = holder->_mutable_data_ptr_no_checks().get();
  std::optional<DevicePager::Page> page;
  if (pager != nullptr) {
    // The copy starts after the kernels queued so far (the producer); the block may go back right after.
    absl::StatusOr<DevicePager::Page> out = pager->PageOut(bytes, nbytes);
    if (!out.ok()) return out.status();
    page = *out;
  } else {
    std::vector<std::byte> staging;  // memory host code cannot read is copied to the host first
    if (!memory_->host_accessible()) {
      staging.resize(nbytes);
      if (absl::Status copied = memory_->CopyToHost(staging.data(), bytes, nbytes); !copied.ok()) return copied;
      bytes = staging.data();
    }
    if (absl::Status stored = tier_->Store(s, bytes, nbytes); !stored.ok()) return stored;
  }
  RecordMemoryEvent(MemoryEventKind::kPageOut, address, nbytes, s, memory_->history_device());
  const MemoryEventScope history("remat: page out", /*op=*/false);
  if (shadows_[s]) {
    shadows_[s].reset();  // frees its memory: nobody else holds a shadow
  } else if (absl::StatusOr<std::size_t> dropped = EvictStorage(*holder); !dropped.ok()) {
    // Nothing is lost: the storage keeps its memory.
    if (page) {
      (void)pager->Release(*page);
    } else {
      tier_->Release(s);
    }
    return dropped.status();
  }
  if (page) device_pages_[s] = *page;
  paged_evictable_[s] = evictable;
  ++stats_.page_outs;
  stats_.page_out_ns += NowNs() - start;
  return absl::OkStatus();
}

absl::Status TorchExecutor::PageIn(Engine& engine, std::uint32_t s) {
  if (tier_ == nullptr) return Executor::PageIn(engine, s);
  return PageInStatus(engine, s, /*ahead=*/false);
}

absl::Status TorchExecutor::PageInAhead(Engine& engine, std::uint32_t s) {
  if (tier_ == nullptr || memory_->pager() == nullptr) return PageIn(engine, s);
  return PageInStatus(engine, s, /*ahead=*/true);
}

absl::Status TorchExecutor::PageInStatus(Engine& engine, StorageIndex s, bool ahead) {
  // The allocation may make room through the engine (torch errors become statuses, as in Execute).
  try {
    return PageInOrThrow(engine, s, ahead);
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("remat: page-in failed: ", e.what_without_backtrace()));
  }
}

absl::Status TorchExecutor::PageInOrThrow(Engine& engine, StorageIndex s, bool ahead) {
  if (!deferred_error_.ok()) return std::exchange(deferred_error_, absl::OkStatus());
  if (DevicePager* pager = memory_->pager(); pager != nullptr) return PageInThroughPager(engine, s, *pager, ahead);
  const std::int64_t start = NowNs();
  if (!tier_->Holds(s)) return absl::FailedPreconditionError(absl::StrCat("remat: storage ", s, " is not paged"));
  Grow(s);
  const auto nbytes = static_cast<std::size_t>(engine.StorageBytes(s));
  const MemoryEventScope history("remat: page in", /*op=*/false);
  c10::intrusive_ptr<c10::StorageImpl> memory = memory_->NewStorage(nbytes);  // may make room (the arena's handler)
  void* target = memory->_mutable_data_ptr_no_checks().get();
  // On failure the tier copy stays; `memory` goes back to the arena.
  if (memory_->host_accessible()) {
    if (absl::Status loaded = tier_->Load(s, target, nbytes); !loaded.ok()) return loaded;
  } else {
    std::vector<std::byte> staging(nbytes);
    if (absl::Status loaded = tier_->Load(s, staging.data(), nbytes); !loaded.ok()) return loaded;
    if (absl::Status copied = memory_->CopyFromHost(target, staging.data(), nbytes); !copied.ok()) return copied;
  }
  if (absl::Status delivered = Deliver(engine, s, memory, /*copy=*/false, paged_evictable_[s]); !delivered.ok()) {
    return delivered;
  }
  tier_->Release(s);
  RecordMemoryEvent(MemoryEventKind::kPageIn, engine.StorageAddress(s), nbytes, s, memory_->history_device());
  ++stats_.page_ins;
  stats_.page_in_ns += NowNs() - start;
  return absl::OkStatus();
}

void TorchExecutor::DropPaged(Engine& engine, std::uint32_t s) {
  if (tier_ == nullptr) return;
  RecordMemoryEvent(MemoryEventKind::kDropPaged, 0, static_cast<std::uint64_t>(engine.StorageBytes(s)), s,
                    memory_->history_device());
  tier_->Release(s);
  if (auto it = device_pages_.find(s); it != device_pages_.end()) {
    (void)memory_->pager()->Release(it->second);  // its host memory is reused once the copy out has finished
    device_pages_.erase(it);
  }
}

absl::Status TorchExecutor::PageInThroughPager(Engine& engine, StorageIndex s, DevicePager& pager, bool ahead) {
  const std::int64_t start = NowNs();
  auto it = device_pages_.find(s);
  if (it == device_pages_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("remat: storage ", s, " is not paged"));
  }
  const DevicePager::Page page = it->second;  // `it` dies here: making room below pages others out
  Grow(s);
  const auto nbytes = static_cast<std::size_t>(engine.StorageBytes(s));
  const MemoryEventScope history("remat: page in", /*op=*/false);
  c10::intrusive_ptr<c10::StorageImpl> memory = memory_->NewStorage(nbytes);  // may make room (the arena's handler)
  void* target = memory->_mutable_data_ptr_no_checks().get();
  // The block goes to its home first (nothing reads it before the wait below), then the copy fills it.
  if (absl::Status delivered = Deliver(engine, s, memory, /*copy=*/false, paged_evictable_[s]); !delivered.ok()) {
    return delivered;
  }
  memory.reset();
  if (absl::Status copied = pager.PageIn(page, target); !copied.ok()) {
    // The page is still out: drop the memory again, so that the storage is paged as the engine believes.
    if (c10::intrusive_ptr<c10::StorageImpl> holder = Holder(s)) {
      if (shadows_[s]) {
        shadows_[s].reset();
      } else {
        (void)EvictStorage(*holder);
      }
    }
    return copied;
  }
  device_pages_.erase(s);
  unwaited_[s] = page;
  if (!ahead) {
    if (absl::Status waited = SettlePageIn(s); !waited.ok()) return waited;
  }
  RecordMemoryEvent(MemoryEventKind::kPageIn, engine.StorageAddress(s), nbytes, s, memory_->history_device());
  ++stats_.page_ins;
  stats_.page_in_ns += NowNs() - start;
  return absl::OkStatus();
}

absl::Status TorchExecutor::SettlePageIn(StorageIndex s) {
  if (unwaited_.empty()) return absl::OkStatus();
  auto it = unwaited_.find(s);
  if (it == unwaited_.end()) return absl::OkStatus();
  const DevicePager::Page page = it->second;
  unwaited_.erase(it);
  DevicePager* pager = memory_->pager();
  absl::Status waited = pager->WaitForPageIn(page);  // on the device: the host goes on
  absl::Status released = pager->Release(page);
  return waited.ok() ? released : waited;
}

void TorchExecutor::WillRead(Engine&, std::uint32_t s) {
  if (unwaited_.empty()) return;
  if (absl::Status settled = SettlePageIn(s); !settled.ok() && deferred_error_.ok()) deferred_error_ = settled;
}

bool TorchExecutor::InUse(const c10::StorageImpl* impl) const {
  if (std::find(in_use_.begin(), in_use_.end(), impl) != in_use_.end()) return true;
  if (running_op_ == nullptr) return false;
  for (const auto& input : running_op_->input_storages) {
    if (input.get() == impl) return true;
  }
  return false;
}

absl::StatusOr<bool> TorchExecutor::Relocate(Engine& engine, std::uint32_t s, AddressRange avoid) {
  if (absl::Status settled = SettlePageIn(s); !settled.ok()) return settled;  // the move reads the copied bytes
  if (s >= homes_.size() || shadows_[s]) return false;
  c10::intrusive_ptr<c10::StorageImpl> home = homes_[s].lock();
  if (!home || IsEvicted(*home) || !EvictableMemory(*memory_, *home) || InUse(home.get())) return false;
  const std::size_t nbytes = home->nbytes();
  const std::size_t alignment = memory_->alignment();
  const MemoryEventScope history("remat: relocate", /*op=*/false);
  for (const Placement placement : {Placement::kTop, Placement::kLow}) {
    c10::DataPtr fresh = memory_->TryAllocate(nbytes, placement);  // freed on return unless swapped in
    if (fresh.get() == nullptr) return false;
    const auto to = reinterpret_cast<std::uintptr_t>(fresh.get());
    const std::size_t aligned = (nbytes + alignment - 1) / alignment * alignment;
    if (avoid.Overlaps(to, aligned)) continue;
    if (absl::Status copied = memory_->Copy(fresh.get(), home->_mutable_data_ptr_no_checks().get(), nbytes);
        !copied.ok()) {
      return copied;
    }
    c10::DataPtr old = home->set_data_ptr(std::move(fresh));  // the old block is freed when `old` goes
    engine.SetAddress(s, to);
    SetOwner(to, s, /*evictable=*/false);
    return true;
  }
  return false;
}

absl::StatusOr<bool> TorchExecutor::Slide(Engine& engine, std::uint32_t s, std::uintptr_t to) {
  if (absl::Status settled = SettlePageIn(s); !settled.ok()) return settled;  // the move reads the copied bytes
  c10::intrusive_ptr<c10::StorageImpl> holder = Holder(s);
  if (!holder || IsEvicted(*holder) || !EvictableMemory(*memory_, *holder) || InUse(holder.get())) return false;
  const MemoryEventScope history("remat: compact", /*op=*/false);
  const absl::Status slid = memory_->Slide(*holder, to);
  // The engine planned the slide from a listing of the arena taken before it; another thread allocating without
  // the engine (no pressure) may have taken part of the run since. The arena refuses such a move before touching
  // anything: not a failure, the run just cannot be joined now (Engine::Compact stops there).
  if (absl::IsInvalidArgument(slid)) return false;
  if (!slid.ok() && !absl::IsDataLoss(slid)) return slid;
  engine.SetAddress(s, to);  // DataLoss: the block moved without (all of) its bytes; the op fails with the error
  if (!slid.ok()) return slid;
  return true;
}

void TorchExecutor::Clear() {
  if (DevicePager* pager = memory_->pager(); pager != nullptr) {
    std::vector<StorageIndex> unwaited;
    for (const auto& [s, page] : unwaited_) unwaited.push_back(s);
    for (StorageIndex s : unwaited) (void)SettlePageIn(s);  // what the program keeps is read after its copy
    for (const auto& [s, page] : device_pages_) (void)pager->Release(page);
  }
  unwaited_.clear();
  device_pages_.clear();
  deferred_error_ = absl::OkStatus();
  ops_.clear();
  homes_.clear();
  shadows_.clear();
}

void TorchExecutor::Forget(const RecycledIds& ids) {
  // No record is kept under a recycled op id: the bridge has Engine::Recycle skip the ops it keeps records for.
  for (const StorageIndex s : ids.storages) {
    if (s >= homes_.size()) continue;
    homes_[s] = c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>());
    shadows_[s].reset();
    paged_evictable_[s] = true;
    if (DevicePager* pager = memory_->pager(); pager != nullptr) {
      (void)SettlePageIn(s);
      if (auto it = device_pages_.find(s); it != device_pages_.end()) {
        (void)pager->Release(it->second);
        device_pages_.erase(it);
      }
    }
  }
}

}  // namespace remat::integration
