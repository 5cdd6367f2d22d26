// EngineBridge: see engine_bridge.h for the contract.
#include "integration/engine_bridge.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "integration/op_cost.h"
#include "integration/op_effects.h"
#include "integration/opaque_call.h"
#include "integration/storage_eviction.h"
#include "policies/registry.h"

namespace remat::integration {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  // Most messages already name remat; do not say it twice.
  const std::string message(status.message());
  const char* prefix = absl::StartsWith(message, "remat: ") ? "" : "remat: ";
  if (absl::IsResourceExhausted(status)) TORCH_CHECK_WITH(OutOfMemoryError, false, prefix, message);
  TORCH_CHECK(false, prefix, message);
  __builtin_unreachable();
}

// `t` reaches every byte of its storage, once.
bool CoversStorage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         static_cast<std::size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

template <typename Visit>
void ForEachTensor(const c10::IValue& value, Visit&& visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) visit(t);
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toList()) ForEachTensor(e, visit);
  }
}

RngFingerprint DefaultCpuRngFingerprint() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  auto* cpu = generator.get<at::CPUGeneratorImpl>();
  const at::mt19937_data_pod& data = cpu->engine().data();
  return RngFingerprint{data.seed_, data.left_, data.next_, data.state_.front(), data.state_.back(),
                        cpu->next_float_normal_sample(), cpu->next_double_normal_sample()};
}

std::uintptr_t AddressOf(c10::StorageImpl& impl) {
  return reinterpret_cast<std::uintptr_t>(impl._mutable_data_ptr_no_checks().get());
}

// Dying constants up to this size that records read are kept (at most 1/64 of the budget in all).
constexpr std::int64_t kKeptConstantMaxBytes = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<EngineBridge>> EngineBridge::Create(const BridgeOptions& options) {
  absl::StatusOr<std::unique_ptr<Policy>> policy = MakePolicy(options.policy);
  if (!policy.ok()) return policy.status();
  if (options.budget == 0) return absl::InvalidArgumentError("remat: the budget must be > 0 bytes");
  std::unique_ptr<HostTier> tier;
  if (options.paging.mode != OffloadMode::kOff) {
    if (options.paging.host_budget <= 0) {
      return absl::InvalidArgumentError("remat: the host budget for paging must be > 0 bytes");
    }
    if (!(options.paging.bandwidth_bytes_per_s > 0) || options.paging.latency_ns < 0) {
      return absl::InvalidArgumentError("remat: the paging link needs a bandwidth > 0 and a latency >= 0");
    }
    absl::StatusOr<std::unique_ptr<HostTier>> made =
        HostTier::Create(HostTierOptions{options.host_tier, options.paging.host_budget, options.host_tier_directory});
    if (!made.ok()) return made.status();
    tier = std::move(*made);
  }
  return std::unique_ptr<EngineBridge>(new EngineBridge(options, std::move(*policy), std::move(tier)));
}

EngineBridge::EngineBridge(const BridgeOptions& options, std::unique_ptr<Policy> policy,
                           std::unique_ptr<HostTier> tier)
    : options_(options),
      memory_(options.memory != nullptr ? options.memory : &default_memory_),
      policy_(std::move(policy)),
      tier_(std::move(tier)) {
  EngineOptions engine_options;
  engine_options.mode = AccountingMode::kArena;
  engine_options.budget = static_cast<std::int64_t>(options.budget);
  engine_options.policy = policy_.get();
  engine_options.arena = memory_->arena();
  engine_options.free_released_constants = true;  // we free a dead constant's memory ourselves (Sweep)
  engine_options.free_dead = true;
  engine_options.paging = options.paging;
  executor_.SetMemory(memory_);
  executor_.SetHostTier(tier_.get());
  executor_.SetLock(&lock_);
  engine_ = std::make_unique<Engine>(engine_options, &executor_);
}

EngineBridge::~EngineBridge() {
  executor_.Clear();
  engine_.reset();
  tier_.reset();
}

void EngineBridge::Unlock() {
  executor_.SetRunningOp(nullptr);
  lock_.unlock();
}

EngineBridge::Entry& EngineBridge::EntryFor(c10::StorageImpl* impl) {
  auto it = entries_.find(impl);
  if (it != entries_.end()) return it->second;
  // Made outside remat's view (before enable, numpy, from_blob, another thread): a constant.
  const std::int64_t nbytes = impl->sym_nbytes().is_heap_allocated() ? 0 : static_cast<std::int64_t>(impl->nbytes());
  const std::uintptr_t address = memory_->Owns(impl->_mutable_data_ptr_no_checks()) ? AddressOf(*impl) : 0;
  const TensorId t = engine_->AdoptConstant(nbytes, address, "constant");
  auto strong = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl);
  Entry entry;
  entry.weak = c10::weak_intrusive_ptr<c10::StorageImpl>(strong);
  entry.root = t;
  entry.pinned = true;
  executor_.SetHome(engine_->StorageOf(t), strong);
  owner_[engine_->StorageOf(t)] = impl;
  ++stats_.constants;
  live_.push_back(impl);
  return entries_.emplace(impl, std::move(entry)).first->second;
}

void EngineBridge::PinEntry(Entry& entry) {
  if (entry.pinned) return;
  if (!engine_->Defined(entry.root)) {
    if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) Throw(status);
  }
  engine_->Pin(entry.root);
  entry.pinned = true;
  if (c10::intrusive_ptr<c10::StorageImpl> impl = entry.weak.lock()) {
    executor_.SetOwner(AddressOf(*impl), engine_->StorageOf(entry.root), /*evictable=*/false);
  }
}

// Pins every live storage whose replay could read constant `start` (directly, or through storages no user holds
// any more): `start` is about to change or go away.
void EngineBridge::PinDependents(StorageIndex start) {
  ++stats_.generations;
  std::vector<StorageIndex> work = {start};
  absl::flat_hash_set<StorageIndex> seen = {start};
  while (!work.empty()) {
    const StorageIndex s = work.back();
    work.pop_back();
    auto readers = readers_.find(s);
    if (readers == readers_.end()) continue;
    for (const OpId op : readers->second) {
      const ReplayOp* replay = executor_.Op(op);
      if (replay == nullptr) continue;
      auto visit = [&](StorageIndex o) {
        if (o == kNoIndex || !seen.insert(o).second) return;
        auto owner = owner_.find(o);
        if (owner != owner_.end()) {
          Entry& entry = entries_.at(owner->second);
          if (!entry.released) {
            PinEntry(entry);  // resident from now on: what is computed from it replays from it
            return;
          }
        }
        work.push_back(o);
      };
      for (const StorageIndex o : replay->output_storage) visit(o);
      for (const auto& [k, o] : replay->in_place) visit(o);
    }
  }
}

void EngineBridge::Sweep() {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < live_.size(); ++i) {
    const c10::StorageImpl* key = live_[i];
    Entry& entry = entries_.at(key);
    if (entry.released) continue;
    if (static_cast<std::int64_t>(entry.weak.use_count()) > entry.record_refs) {
      live_[kept++] = key;
      continue;
    }
    entry.released = true;
    ++stats_.released;
    if (entry.pinned) {
      const StorageIndex s = engine_->StorageOf(entry.root);
      const std::int64_t bytes = engine_->StorageBytes(s);
      // A small constant that records read (a wrapped scalar such as the 1/sqrt(d) of attention) is kept, still
      // a constant: cheaper than pinning everything computed from it.
      if (entry.record_refs > 0 && bytes <= kKeptConstantMaxBytes &&
          stats_.kept_constant_bytes + bytes <= static_cast<std::int64_t>(options_.budget / 64)) {
        stats_.kept_constant_bytes += bytes;
        entry.kept = true;
        continue;
      }
      // A constant goes away. If a record may read it in a replay, nothing live may need such a replay.
      if (entry.record_refs > 0) PinDependents(s);
      engine_->Release(entry.root);
      if (c10::intrusive_ptr<c10::StorageImpl> impl = entry.weak.lock()) {
        if (!IsEvicted(*impl) && impl->nbytes() > 0 && AddressOf(*impl) != 0) (void)EvictStorage(*impl);
      }
    } else {
      engine_->Release(entry.root);  // evicts it now; it stays recomputable
    }
  }
  live_.resize(kept);
}

bool EngineBridge::PinState(c10::StorageImpl* impl) {
  std::lock_guard<EngineLock> lock(lock_);
  auto it = entries_.find(impl);
  if (it == entries_.end() || it->second.pinned || it->second.released) return false;
  PinEntry(it->second);
  ++stats_.pinned_state;
  return true;
}

void EngineBridge::CountRecordRefs(const OpRecord& record, int delta) {
  auto count = [&](const c10::StorageImpl* impl) {
    auto it = entries_.find(impl);
    if (it != entries_.end()) it->second.record_refs += delta;
  };
  for (const auto& storage : record.input_storages) count(storage.get());
  for (const c10::IValue& value : record.arguments) {
    ForEachTensor(value, [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) count(t.storage().unsafeGetStorageImpl());
    });
  }
}

void EngineBridge::Prune() {
  engine_->CollectDead();
  std::size_t kept = 0;
  // Dropped records leave their inputs' reader lists in one pass per list afterwards: a constant every op reads
  // has a list as long as the records kept since the last prune.
  std::vector<OpId> dropped_ops;
  std::vector<StorageIndex> read_storages;
  for (const OpId op : kept_ops_) {
    const ReplayOp* replay = executor_.Op(op);
    if (replay == nullptr) continue;
    // Needed while the engine may replay the op: some output neither dead nor pinned (Engine::OpInert).
    if (!engine_->OpInert(op)) {
      kept_ops_[kept++] = op;
      continue;
    }
    std::unique_ptr<ReplayOp> dropped = executor_.TakeOp(op);
    CountRecordRefs(dropped->record, -1);
    for (const TensorId t : dropped->inputs) {
      if (t != kNoIndex) read_storages.push_back(engine_->StorageOf(t));
    }
    dropped_ops.push_back(op);
    ++stats_.pruned_records;
  }
  kept_ops_.resize(kept);
  std::sort(dropped_ops.begin(), dropped_ops.end());  // op ids are recycled: not in creation order
  std::sort(read_storages.begin(), read_storages.end());
  read_storages.erase(std::unique(read_storages.begin(), read_storages.end()), read_storages.end());
  for (const StorageIndex s : read_storages) {
    auto readers = readers_.find(s);
    if (readers == readers_.end()) continue;
    std::erase_if(readers->second,
                  [&](OpId op) { return std::binary_search(dropped_ops.begin(), dropped_ops.end(), op); });
    if (readers->second.empty()) readers_.erase(readers);
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& entry = it->second;
    if (!entry.released || entry.record_refs > 0) {
      ++it;
      continue;
    }
    if (entry.kept) {  // no record reads it any more: the engine lets it go; its memory goes with the StorageImpl
      stats_.kept_constant_bytes -= engine_->StorageBytes(engine_->StorageOf(entry.root));
      engine_->Release(entry.root);
      entry.kept = false;
    }
    if (entry.weak.use_count() > 0) {
      ++it;
      continue;
    }
    auto owner = owner_.find(engine_->StorageOf(entry.root));
    if (owner != owner_.end() && owner->second == it->first) owner_.erase(owner);
    entries_.erase(it++);
    ++stats_.pruned_entries;
  }
  Recycle();
}

// The engine recycles what nothing can need (Engine::Recycle); the ids it frees will name other ops and storages,
// so every reference the bridge and the executor keep under them goes. A records's op is recycled only once it is
// inert, and Prune has dropped those records just before.
void EngineBridge::Recycle() {
  const RecycledIds ids = engine_->Recycle();
  if (ids.storages.empty() && ids.ops.empty()) return;
  const absl::flat_hash_set<TensorId> tensors(ids.tensors.begin(), ids.tensors.end());
  for (const StorageIndex s : ids.storages) {
    readers_.erase(s);
    auto owner = owner_.find(s);
    if (owner == owner_.end()) continue;
    auto entry = entries_.find(owner->second);
    // A released entry whose StorageImpl has not gone yet: its engine storage is gone, so it goes too.
    if (entry != entries_.end() && tensors.contains(entry->second.root)) {
      TORCH_CHECK(entry->second.released, "remat: the engine recycled a storage a live tensor holds");
      entries_.erase(entry);
      ++stats_.pruned_entries;
    }
    owner_.erase(owner);
  }
  executor_.Forget(ids);
}

void EngineBridge::BeforeOp(OpRecord& record) {
  lock_.lock();
  try {
    if (retired_.load(std::memory_order_acquire)) {  // being destroyed: the op runs unrecorded
      current_.active = false;
      lock_.BeginLend();
      return;
    }
    if (options_.next != nullptr) options_.next->BeforeOp(record);
    engine_->NoteAllocation();
    Sweep();
    if (++ops_since_prune_ >= 1024) {
      ops_since_prune_ = 0;
      Prune();
    }
    const OpTraits& traits = *record.traits;
    const std::size_t n = record.input_storages.size();
    current_.inputs.assign(n, kNoIndex);
    current_.written.assign(n, false);
    current_.written_returned.assign(n, false);
    current_.overwrite.assign(n, false);
    std::vector<bool> covered(n, false);
    // What the op writes (op_effects.h): the schema's written arguments, then the writes it does not declare (never
    // returned: written on the side).
    const std::size_t annotated = traits.written_arguments.size();
    for (std::size_t w = 0; w < annotated + record.unannotated_writes.size(); ++w) {
      const bool declared = w < annotated;
      const int a = declared ? traits.written_arguments[w] : record.unannotated_writes[w - annotated];
      const bool returned = declared && std::find(traits.return_aliases.begin(), traits.return_aliases.end(), a) !=
                                            traits.return_aliases.end();
      const bool overwrites =
          declared && (traits.out_argument[w] || (a == 0 && OverwritesSelf(record.op.schema().name())));
      ForEachTensor(record.arguments[a], [&](const at::Tensor& t) {
        if (!t.defined() || !t.has_storage()) return;
        for (std::size_t k = 0; k < n; ++k) {
          if (record.input_storages[k].get() != t.storage().unsafeGetStorageImpl()) continue;
          current_.written[k] = true;
          current_.written_returned[k] = current_.written_returned[k] || returned;
          covered[k] = covered[k] || (overwrites && returned && CoversStorage(t));
        }
      });
    }
    // A blank constant overwritten entirely: its old value leaves the engine now (nothing can read garbage), the
    // new one is registered by AfterOp as a fresh output. Only when the storage is passed once (not also read).
    for (std::size_t k = 0; k < n; ++k) {
      if (!covered[k]) continue;
      auto it = entries_.find(record.input_storages[k].get());
      if (it == entries_.end() || !it->second.blank || it->second.released) continue;
      int uses = 0;
      for (const c10::IValue& value : record.arguments) {
        ForEachTensor(value, [&](const at::Tensor& t) {
          uses += t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == record.input_storages[k].get();
        });
      }
      if (uses != 1) continue;
      Entry& entry = it->second;
      const StorageIndex old = engine_->StorageOf(entry.root);
      if (engine_->Paged(old)) {  // its memory comes back for the op to write into
        if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) Throw(status);
      }
      if (entry.record_refs > 0) PinDependents(old);
      executor_.ClearHome(old);
      owner_.erase(old);
      engine_->Release(entry.root);
      entry.blank = false;
      entry.pinned = false;
      current_.overwrite[k] = true;
    }
    std::vector<StorageIndex> overwritten;  // constants this op writes
    std::vector<TensorId> engine_inputs;
    engine_inputs.reserve(n);
    for (std::size_t k = 0; k < n; ++k) {
      Entry& entry = EntryFor(record.input_storages[k].get());
      if (current_.overwrite[k] || !current_.written[k]) continue;
      // Written on the side (running stats): a constant, replayed on a copy. Like any constant written, whatever
      // a replay could compute from its old value is pinned first (an eval-mode batch norm read the running stats).
      if (!current_.written_returned[k]) PinEntry(entry);
      if (entry.pinned) overwritten.push_back(engine_->StorageOf(entry.root));
    }
    for (const StorageIndex s : overwritten) PinDependents(s);
    for (std::size_t k = 0; k < n; ++k) {
      if (current_.overwrite[k] || (current_.written[k] && !current_.written_returned[k])) continue;
      current_.inputs[k] = entries_.at(record.input_storages[k].get()).root;
      engine_inputs.push_back(current_.inputs[k]);
    }
    // Constants written on the side go last (EndOp's in_place_of positions count the ones above): BeginOp pages
    // them in if they are paged and locks them while the kernel runs. Replays do not read them through the engine.
    for (std::size_t k = 0; k < n; ++k) {
      if (current_.overwrite[k] || !current_.written[k] || current_.written_returned[k]) continue;
      const TensorId side = entries_.at(record.input_storages[k].get()).root;
      if (std::find(engine_inputs.begin(), engine_inputs.end(), side) == engine_inputs.end()) {
        engine_inputs.push_back(side);
      }
    }
    // An op whose generator state was captured (random ops, opaque calls) replays with it; any other op that moves
    // the default generator is not replayable.
    current_.check_rng = !traits.random && !record.rng.has_value() && record.replayable;
    if (current_.check_rng) current_.rng_before = DefaultCpuRngFingerprint();
    absl::StatusOr<OpId> op = engine_->BeginOp(engine_inputs, traits.name);
    if (!op.ok()) Throw(op.status());
    // From here the kernel may read its inputs: their memory must not move (until now, while BeginOp replayed
    // what they need, it could).
    executor_.SetRunningOp(&record);
    current_.op = *op;
    current_.active = true;
    if (policy_->UsesWindows()) {
      memory_->SetPlacementForThisThread(engine_->OpCostly(*op) ? Placement::kLow : Placement::kHigh);
    }
    lock_.BeginLend();  // the kernel runs now: allocations on any thread may borrow the lock to make room
  } catch (...) {
    current_.active = false;
    Unlock();
    throw;
  }
}

void EngineBridge::AfterOp(OpRecord&& record) {
  lock_.EndLend();
  struct Release {
    EngineBridge* self;
    ~Release() { self->Unlock(); }
  } release{this};
  if (options_.next != nullptr) {
    OpRecord copy = record;
    options_.next->AfterOp(std::move(copy));
  }
  if (!current_.active) return;
  current_.active = false;
  if (policy_->UsesWindows()) memory_->SetPlacementForThisThread(Placement::kLow);
  ++stats_.ops;
  const OpTraits& traits = *record.traits;
  const std::size_t n = record.input_storages.size();
  std::vector<int> engine_position(n, -1);
  for (std::size_t k = 0, p = 0; k < n; ++k) {
    if (current_.inputs[k] != kNoIndex) engine_position[k] = static_cast<int>(p++);
  }
  std::vector<OutputSpec> specs;
  std::vector<int> spec_output;  // index into record.outputs, or -1 - k for an in-place write of input k
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> spec_impl;
  for (std::size_t i = 0; i < record.outputs.size(); ++i) {
    const CapturedOutput& out = record.outputs[i];
    if (out.input_storage >= 0) continue;  // a view of an input (or an input written in place: below)
    c10::intrusive_ptr<c10::StorageImpl> impl = out.storage.lock();
    if (!impl || entries_.contains(impl.get())) continue;
    bool seen = false;
    for (const auto& s : spec_impl) seen = seen || s.get() == impl.get();
    if (seen) continue;  // a second view of a fresh storage
    OutputSpec spec;
    spec.bytes = static_cast<std::int64_t>(out.storage_nbytes);
    spec.address = AddressOf(*impl);
    specs.push_back(spec);
    spec_output.push_back(static_cast<int>(i));
    spec_impl.push_back(std::move(impl));
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (!current_.overwrite[k]) continue;
    c10::StorageImpl& impl = *record.input_storages[k];
    OutputSpec spec;
    spec.bytes = static_cast<std::int64_t>(impl.nbytes());
    spec.address = AddressOf(impl);
    specs.push_back(spec);
    spec_output.push_back(-1 - static_cast<int>(k));
    spec_impl.push_back(record.input_storages[k]);
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (!current_.written_returned[k] || engine_position[k] < 0) continue;
    OutputSpec spec;
    spec.in_place_of = engine_position[k];
    specs.push_back(spec);
    spec_output.push_back(-1 - static_cast<int>(k));
    spec_impl.push_back(record.input_storages[k]);
  }
  const std::int64_t cost = std::max<std::int64_t>(
      1, options_.estimated_costs ? EstimatedCostNs(record) : static_cast<std::int64_t>(record.duration_ns));
  absl::StatusOr<std::span<const TensorId>> outs = engine_->EndOp(current_.op, specs, cost);
  if (!outs.ok()) Throw(outs.status());
  const std::vector<TensorId> out_tensors(outs->begin(), outs->end());
  // An op that read an exported storage (MakeResident, writable) may have read bytes written behind remat's back,
  // which a replay would not see again.
  bool reads_export = false;
  for (std::size_t k = 0; k < n; ++k) {
    auto it = entries_.find(record.input_storages[k].get());
    reads_export = reads_export || (it != entries_.end() && it->second.exported);
  }
  // A compiled graph's replay runs the whole graph again and needs its whole working set at once (every buffer of
  // a block's forward, while the op that wanted one output holds its own inputs): with a second tier, paging its
  // outputs costs a copy and no transient memory, so they stay constants (pageable); drop-only, they are replayed.
  const bool compiled_graph_paged = options_.paging.mode != OffloadMode::kOff && traits.name == kOpaqueCallOperator;
  const bool replayable = record.replayable && !reads_export && !ProducesUninitializedMemory(traits.name) &&
                          !compiled_graph_paged &&
                          !(current_.check_rng && current_.rng_before != DefaultCpuRngFingerprint());
  auto replay = std::make_unique<ReplayOp>(OpRecord(record.op, traits));
  replay->output_storage.assign(record.outputs.size(), kNoIndex);
  bool keep = false;
  // An evictable result of a backward-pass op (a gradient, or one accumulated in place) goes last (header: Backward).
  auto defer_if_backward = [&](TensorId t) {
    if (!record.in_backward) return;
    engine_->Defer(t);
    ++stats_.deferred_outputs;
  };
  for (std::size_t j = 0; j < specs.size(); ++j) {
    const TensorId t = out_tensors[j];
    const StorageIndex s = engine_->StorageOf(t);
    const c10::intrusive_ptr<c10::StorageImpl>& impl = spec_impl[j];
    if (spec_output[j] >= 0) {  // a fresh storage
      Entry entry;
      entry.weak = c10::weak_intrusive_ptr<c10::StorageImpl>(impl);
      entry.root = t;
      executor_.SetHome(s, impl);
      if (replayable && EvictableMemory(*memory_, *impl)) {
        executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/true);
        replay->output_storage[spec_output[j]] = s;
        keep = true;
        defer_if_backward(t);
      } else {
        engine_->Pin(t);
        entry.pinned = true;
        entry.blank = ProducesUninitializedMemory(traits.name);
        ++stats_.pinned_outputs;
      }
      entries_.emplace(impl.get(), std::move(entry));
      owner_[s] = impl.get();
      live_.push_back(impl.get());
      continue;
    }
    // An in-place write of input k: the StorageImpl now holds the new version t; the old one has no home. (A
    // blank storage overwritten entirely left the engine in BeforeOp: t is simply a fresh value in it.)
    const int k = -1 - spec_output[j];
    Entry& entry = entries_.at(impl.get());
    if (!current_.overwrite[k]) {
      const TensorId old = entry.root;
      executor_.ClearHome(engine_->StorageOf(old));
      owner_.erase(engine_->StorageOf(old));
      engine_->Release(old);
    }
    entry.root = t;
    owner_[s] = impl.get();
    executor_.SetHome(s, impl);
    if (entry.pinned) continue;  // a constant written in place stays a constant (the engine pinned it)
    if (replayable && EvictableMemory(*memory_, *impl)) {
      executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/true);
      replay->in_place.emplace_back(k, s);
      keep = true;
      defer_if_backward(t);
    } else {
      engine_->Pin(t);
      entry.pinned = true;
      executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/false);
    }
  }
  if (!keep) return;
  replay->inputs = current_.inputs;
  replay->written = current_.written;
  replay->overwritten = current_.overwrite;
  for (const TensorId t : current_.inputs) {
    if (t != kNoIndex) readers_[engine_->StorageOf(t)].push_back(current_.op);
  }
  CountRecordRefs(record);
  replay->record = std::move(record);
  executor_.AddOp(current_.op, std::move(replay));
  kept_ops_.push_back(current_.op);
}

void EngineBridge::OpFailed(OpRecord& record) noexcept {
  lock_.EndLend();
  if (current_.active) {
    engine_->AbortOp(current_.op);
    current_.active = false;
    // A blank storage the op was to overwrite left the engine in BeforeOp: it is a constant again.
    for (std::size_t k = 0; k < current_.overwrite.size(); ++k) {
      if (!current_.overwrite[k]) continue;
      c10::StorageImpl& impl = *record.input_storages[k];
      Entry& entry = entries_.at(&impl);
      entry.root = engine_->AdoptConstant(static_cast<std::int64_t>(impl.nbytes()), AddressOf(impl), "constant");
      entry.pinned = true;
      owner_[engine_->StorageOf(entry.root)] = &impl;
      executor_.SetHome(engine_->StorageOf(entry.root), record.input_storages[k]);
    }
  }
  if (policy_->UsesWindows()) memory_->SetPlacementForThisThread(Placement::kLow);
  if (options_.next != nullptr) options_.next->OpFailed(record);
  Unlock();
}

bool EngineBridge::RetryAfterOutOfMemory(OpRecord& record) {
  if (!current_.active) return false;
  // An op not known to be random that drew from the default generator before failing would draw other numbers.
  if (current_.check_rng && current_.rng_before != DefaultCpuRngFingerprint()) return false;
  lock_.EndLend();
  executor_.SetRunningOp(nullptr);  // its kernel has unwound: nothing reads its inputs until it runs again
  const absl::StatusOr<bool> retry = engine_->MakeHoleForRetry();
  executor_.SetRunningOp(&record);
  lock_.BeginLend();
  if (!retry.ok()) Throw(retry.status());  // a failed move, not the out-of-memory it was for (the hook cleans up)
  if (*retry) ++stats_.retried_ops;
  return *retry;
}

absl::StatusOr<bool> EngineBridge::MakeRoom(Arena& arena, std::size_t bytes) {
  if (retired_.load(std::memory_order_acquire)) return false;
  EngineLock::RoomAccess access(lock_);  // waits unless this thread holds the lock or may borrow it (header)
  if (retired_.load(std::memory_order_acquire)) return false;
  stats_.borrowed_room += access.borrowed_from_another_thread();
  return engine_->MakeRoom(arena, bytes);
}

std::string EngineBridge::DescribeMemory() {
  EngineLock::RoomAccess access(lock_);
  return engine_->DescribeMemory();
}

absl::Status EngineBridge::Retire() {
  std::lock_guard<EngineLock> lock(lock_);
  absl::Status status = MaterializeLive();
  retired_.store(true, std::memory_order_release);
  return status;
}

std::int64_t EngineBridge::HeldReferences(const c10::StorageImpl* storage) {
  std::lock_guard<EngineLock> lock(lock_);
  auto it = entries_.find(storage);
  return it == entries_.end() ? 0 : it->second.record_refs;
}

absl::Status EngineBridge::FixEntry(Entry& entry) {
  if (!engine_->Defined(entry.root) || engine_->Paged(engine_->StorageOf(entry.root))) {
    if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) return status;
  }
  PinEntry(entry);
  engine_->Fix(entry.root);
  return absl::OkStatus();
}

absl::Status EngineBridge::MakeResident(c10::StorageImpl* impl, bool writable) {
  std::lock_guard<EngineLock> lock(lock_);
  auto it = entries_.find(impl);
  if (it == entries_.end() || it->second.released) {
    if (IsEvicted(*impl)) {
      return absl::FailedPreconditionError("remat: an evicted storage remat no longer tracks cannot be brought back");
    }
    return absl::OkStatus();  // not remat's: a constant made outside its view keeps its memory anyway
  }
  Entry& entry = it->second;
  if (absl::Status status = FixEntry(entry); !status.ok()) return status;
  const StorageIndex s = engine_->StorageOf(entry.root);
  // share_memory_() moves the bytes out of the arena: the engine must not take the old address for this storage.
  engine_->SetAddress(s, memory_->Owns(impl->_mutable_data_ptr_no_checks()) ? AddressOf(*impl) : 0);
  if (writable && !entry.exported) {
    entry.exported = true;
    PinDependents(s);  // what was computed from the bytes as they are now stays as it is
  }
  return absl::OkStatus();
}

absl::Status EngineBridge::StorageWillChange(c10::StorageImpl* impl) {
  std::lock_guard<EngineLock> lock(lock_);
  auto it = entries_.find(impl);
  if (it == entries_.end() || it->second.released) return absl::OkStatus();
  Entry& entry = it->second;
  if (absl::Status status = FixEntry(entry); !status.ok()) return status;
  const StorageIndex s = engine_->StorageOf(entry.root);
  engine_->SetAddress(s, 0);  // the block is about to be freed or replaced: the engine must not use its address
  PinDependents(s);
  return absl::OkStatus();
}

absl::Status EngineBridge::MaterializeLive() {
  std::lock_guard<EngineLock> lock(lock_);
  Sweep();  // storages whose last reference died since the last op need no bytes
  // What comes back is pinned, and a pinned storage could be paged out again to make room for the next one (with
  // page_constants): nothing may leave the device from here on.
  const bool page_constants = engine_->page_constants();
  engine_->SetPageConstants(false);
  absl::Status result = absl::OkStatus();
  for (const c10::StorageImpl* key : live_) {
    Entry& entry = entries_.at(key);
    if (entry.released) continue;
    if (entry.pinned) {  // a paged constant comes back from its host copy
      if (engine_->Paged(engine_->StorageOf(entry.root))) {
        if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok() && result.ok()) result = status;
      }
      continue;
    }
    // Pinned as it comes back, so that bringing back the next one cannot evict it again.
    if (!engine_->Defined(entry.root)) {
      if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) {
        if (result.ok()) result = status;
        continue;
      }
    }
    engine_->Pin(entry.root);
    entry.pinned = true;
  }
  engine_->SetPageConstants(page_constants);
  if (!result.ok()) return result;
  // Nothing may stay in the host tier, which dies with the bridge.
  std::int64_t paged_bytes = 0;
  int paged = 0;
  for (const c10::StorageImpl* key : live_) {
    const Entry& entry = entries_.at(key);
    if (entry.released || !engine_->Paged(engine_->StorageOf(entry.root))) continue;
    ++paged;
    paged_bytes += static_cast<std::int64_t>(key->nbytes());
  }
  if (paged > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("remat: ", paged, " storages still held (", paged_bytes,
                                                     " bytes) are in the host tier and do not fit back in the budget"));
  }
  return absl::OkStatus();
}

BridgeStats EngineBridge::Stats() {
  std::lock_guard<EngineLock> lock(lock_);
  BridgeStats stats = stats_;
  stats.engine = engine_->stats();
  stats.engine_tables = engine_->tables();
  stats.executor = executor_.stats();
  if (tier_ != nullptr) stats.host_tier = tier_->stats();
  stats.kept_records = static_cast<std::int64_t>(kept_ops_.size());
  stats.tracked_storages = static_cast<std::int64_t>(entries_.size());
  return stats;
}

}  // namespace remat::integration
