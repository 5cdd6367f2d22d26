// EngineBridge, its storage entries (engine_bridge.h, "Storages", "Last references", "Writes to constants",
// "Pruning"): mapping StorageImpls to engine tensors, sweeping for last references, pinning what a changing constant
// feeds, taking over the copies autograd saves inside in-place ops (AdoptHiddenCopy), pruning records and recycling
// with the engine, exports (MakeResident, StorageWillChange) and bringing everything back before remat is switched
// off (MaterializeLive).
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "integration/engine_bridge.h"
#include "integration/engine_bridge_internal.h"
#include "integration/memory_events.h"
#include "integration/pin_listener.h"
#include "integration/storage_eviction.h"

namespace remat::integration {

using bridge_internal::AddressOf;
using bridge_internal::ForEachTensor;
using bridge_internal::Throw;

namespace {

// Dying constants up to this size that records read are kept (at most 1/64 of the budget in all).
constexpr std::int64_t kKeptConstantMaxBytes = 4096;

}  // namespace

EngineBridge::Entry& EngineBridge::EntryFor(c10::StorageImpl* impl) {
  if (Entry* known = entries_.Find(impl)) return *known;
  // Made outside remat's view (before enable, numpy, from_blob, another thread): a constant.
  const std::int64_t nbytes = impl->sym_nbytes().is_heap_allocated() ? 0 : static_cast<std::int64_t>(impl->nbytes());
  const std::uintptr_t address = memory_->Owns(impl->_mutable_data_ptr_no_checks()) ? AddressOf(*impl) : 0;
  const TensorId t = engine_->AdoptConstant(nbytes, address, "constant");
  auto strong = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl);
  Entry& entry = entries_.Add(strong);
  entry.root = t;
  entry.pinned = true;
  // Memory torch borrowed (torch.from_numpy, DLPack, frombuffer): its owner may rewrite it between ops, so ops
  // that read it are not replayed, as after a writable export.
  entry.exported = memory_->Borrowed(impl->_mutable_data_ptr_no_checks());
  executor_.SetHome(engine_->StorageOf(t), strong);
  links_.SetOwner(engine_->StorageOf(t), impl);
  ++stats_.constants;
  return entry;
}

void EngineBridge::PinEntry(Entry& entry, const PinReason* reason) {
  if (entry.pinned) return;
  if (!engine_->Defined(entry.root)) {
    if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) {
      if (reason == nullptr) Throw(status);
      // Composed only here: PinDependents runs before every in-place write of a constant (each optimizer update).
      const std::string why =
          reason->writer.empty()
              ? absl::StrCat("before a value its replay reads ", reason->event)
              : absl::StrCat("before '", reason->writer,
                             "' overwrote a value its replay reads (an optimizer step writing a parameter, a running "
                             "statistic), as every result computed from that value must be");
      Throw(absl::Status(status.code(), absl::StrCat(status.message(), "; it was brought back to be kept ", why)));
    }
  }
  engine_->Pin(entry.root);
  entry.pinned = true;
  if (c10::intrusive_ptr<c10::StorageImpl> impl = entry.weak.lock()) {
    executor_.SetOwner(AddressOf(*impl), engine_->StorageOf(entry.root), /*evictable=*/false);
    NotePinned(impl.get());
  }
}

// Pins every live storage whose replay could read constant `start` (directly, or through storages no user holds
// any more): `start` is about to change or go away.
void EngineBridge::PinDependents(StorageIndex start, PinReason reason) {
  ++stats_.generations;
  ForEachDependent(start, [&](Entry& entry) {
    PinEntry(entry, &reason);  // what is computed from it replays from it
    return true;
  });
}

bool EngineBridge::ForEachDependent(StorageIndex start, absl::FunctionRef<bool(Entry&)> visit_live,
                                    std::size_t max_storages) {
  std::vector<StorageIndex> work = {start};
  absl::flat_hash_set<StorageIndex> seen = {start};
  bool go_on = true;
  while (go_on && !work.empty()) {
    if (seen.size() > max_storages) return false;
    const StorageIndex s = work.back();
    work.pop_back();
    for (const OpId op : links_.Readers(s)) {
      const ReplayOp* replay = executor_.Op(op);
      if (replay == nullptr) continue;
      auto visit = [&](StorageIndex o) {
        if (!go_on || o == kNoIndex || !seen.insert(o).second) return;
        if (const c10::StorageImpl* owner = links_.Owner(o)) {
          Entry& entry = entries_.At(owner);
          if (!entry.released) {
            go_on = visit_live(entry);
            return;
          }
          if (entry.kept) return;  // a constant still: no replay recomputes it, so none goes through it
        }
        work.push_back(o);
      };
      for (const StorageIndex o : replay->output_storage) visit(o);
      for (const auto& [k, o] : replay->in_place) visit(o);
    }
  }
  return true;
}

bool EngineBridge::PinningCostsMoreThan(StorageIndex start, std::int64_t bytes, PinCost cost) {
  std::int64_t counted = 0;
  ForEachDependent(start, [&](Entry& entry) {
    const StorageIndex s = engine_->StorageOf(entry.root);
    const bool counts = !entry.pinned && (cost == PinCost::kNewlyPinned ||
                                          (!entry.from_backward && !engine_->Resident(s)));
    if (counts) counted += engine_->StorageBytes(s);
    return counted <= bytes;  // the answer is known once the sum passes `bytes`
  });
  return counted > bytes;
}

bool EngineBridge::NeededForReplays(StorageIndex start, std::size_t max_storages) {
  bool needed = false;
  const bool walked_all = ForEachDependent(
      start,
      [&](Entry& entry) {
        needed = !entry.pinned;
        return !needed;  // the first one answers
      },
      max_storages);
  return needed || !walked_all;
}

bool EngineBridge::AdoptHiddenCopy(OpRecord& record, int k, TensorId old) {
  for (OpRecord::HiddenCopy& hidden : record.hidden_copies) {
    if (hidden.input_storage != k || hidden.copy == nullptr) continue;
    c10::StorageImpl& copy = *hidden.copy;
    const StorageIndex s = engine_->StorageOf(old);
    if (!hidden.whole_storage || entries_.Contains(&copy) || !EvictableMemory(*memory_, copy) ||
        static_cast<std::int64_t>(copy.nbytes()) != engine_->StorageBytes(s) ||
        !engine_->AdoptCopy(old, AddressOf(copy)).ok()) {
      return false;
    }
    Entry& entry = entries_.Add(hidden.copy);
    entry.root = old;  // the reference the in-place write's entry held
    links_.SetOwner(s, &copy);
    executor_.SetHome(s, hidden.copy);
    executor_.SetOwner(AddressOf(copy), s, /*evictable=*/true);
    hidden.copy.reset();
    ++stats_.adopted_copies;
    return true;
  }
  return false;
}

void EngineBridge::AdoptRemainingCopies(OpRecord& record) {
  for (OpRecord::HiddenCopy& hidden : record.hidden_copies) {
    if (hidden.copy == nullptr) continue;
    if (!entries_.Contains(hidden.copy.get())) {
      EntryFor(hidden.copy.get());
      ++stats_.constant_copies;
    }
  }
  record.hidden_copies.clear();
}

void EngineBridge::Sweep() {
  const std::int64_t released = stats_.released;
  entries_.SweepHeld([&](Entry& entry) { ReleaseIfDead(entry); });
  if (room_made_since_unheld_sweep_ || ++ops_since_unheld_sweep_ >= kUnheldSweepEvery || MemoryHistoryEnabled()) {
    SweepUnheld();
  }
  // A death may be what a kept constant's replays were for (a kept constant holds its memory, as a live one would).
  if (!large_kept_constants_.empty() && stats_.released != released) ReleaseUnneededKeptConstants();
}

void EngineBridge::SweepUnheld() {
  entries_.SweepUnheld([&](Entry& entry) { ReleaseIfDead(entry); });
  ops_since_unheld_sweep_ = 0;
  room_made_since_unheld_sweep_ = false;
}

void EngineBridge::ReleaseIfDead(Entry& entry) {
  const auto uses = static_cast<std::int64_t>(entry.weak.use_count());
  if (entry.released || HeldBeyond(*entry.key, uses, entry.record_refs)) return;
  entry.released = true;
  ++stats_.released;
  if (!entry.pinned) {
    // Evicts it now; it stays recomputable. Records still hold it (its bytes are still there): kept resident while
    // an evicted storage's replay reads it, until the next pressure event.
    engine_->Release(entry.root, /*keep_if_replays_read=*/entry.record_refs > 0);
    return;
  }
  const StorageIndex s = engine_->StorageOf(entry.root);
  const std::int64_t bytes = engine_->StorageBytes(s);
  // A constant that records read is kept, still a constant, while that is cheaper than pinning everything computed
  // from it: a small one (a wrapped scalar such as the 1/sqrt(d) of attention), or one whose Python object made
  // it outlive the program's last use until now (held_references.h) and whose bytes are under half of what it would
  // pin (a compiled block's input, whose Python storage AOTAutograd made, read by the block's saved tensors'
  // replays; half, because kept constants add up step after step while a pinned gradient serves every later step),
  // or one whose evicted dependents would bring back more bytes than it has (results computed from a constant the
  // program let go of: keeping it costs no memory now, bringing them back does).
  // A kept constant goes once nothing live needs it (ReleaseUnneededKeptConstants), at the latest when no record
  // reads it (Prune).
  if (entry.record_refs > 0) {
    const bool small = bytes <= kKeptConstantMaxBytes &&
                       small_kept_constant_bytes_ + bytes <= static_cast<std::int64_t>(options_.budget / 64);
    const bool held_by_its_python_object = uses > entry.record_refs;
    if (small || (held_by_its_python_object && PinningCostsMoreThan(s, 2 * bytes, PinCost::kNewlyPinned)) ||
        PinningCostsMoreThan(s, bytes, PinCost::kBroughtBack)) {
      KeepConstant(entry, bytes, small);
      return;
    }
    // If a record may read it in a replay, nothing live may need such a replay.
    PinDependents(s, {.writer = {}, .event = "went away"});
  }
  LetConstantGo(entry);
}

void EngineBridge::KeepConstant(Entry& entry, std::int64_t bytes, bool small) {
  stats_.kept_constant_bytes += bytes;
  entry.kept = true;
  entry.kept_small = small;
  if (small) {
    small_kept_constant_bytes_ += bytes;
  } else {
    large_kept_constants_.push_back(&entry);
  }
}

void EngineBridge::ForgetKeptConstant(Entry& entry) {
  const std::int64_t bytes = engine_->StorageBytes(engine_->StorageOf(entry.root));
  stats_.kept_constant_bytes -= bytes;
  if (entry.kept_small) {
    small_kept_constant_bytes_ -= bytes;
  } else {
    std::erase(large_kept_constants_, &entry);  // a few entries, and only when one goes
  }
  entry.kept = false;
}

void EngineBridge::LetConstantGo(Entry& entry) {
  engine_->Release(entry.root);
  if (c10::intrusive_ptr<c10::StorageImpl> impl = entry.weak.lock()) {
    if (!IsEvicted(*impl) && impl->nbytes() > 0 && AddressOf(*impl) != 0) (void)EvictStorage(*impl);
  }
}

void EngineBridge::ReleaseUnneededKeptConstants() {
  for (std::size_t looked = 0; looked < kKeptConstantsPerSweep && !large_kept_constants_.empty(); ++looked) {
    if (kept_constants_next_ >= large_kept_constants_.size()) kept_constants_next_ = 0;
    Entry& entry = *large_kept_constants_[kept_constants_next_];
    if (NeededForReplays(engine_->StorageOf(entry.root), kNeededWalkLimit)) {
      ++kept_constants_next_;
      continue;
    }
    ForgetKeptConstant(entry);  // takes it out of the list: the next one moves to its place
    LetConstantGo(entry);
  }
}

bool EngineBridge::PinState(c10::StorageImpl* impl) {
  std::lock_guard<EngineLock> lock(lock_);
  const EngineLock::LendPause pause(lock_);  // called from inside an op's kernel: no borrower meanwhile
  Entry* entry = entries_.Find(impl);
  if (entry == nullptr || entry->pinned || entry->released) return false;
  PinEntry(*entry);
  ++stats_.pinned_state;
  return true;
}

void EngineBridge::CountRecordRefs(const OpRecord& record, int delta, std::span<Entry* const> entries) {
  auto count = [&](const c10::StorageImpl* impl) {
    for (std::size_t k = 0; k < entries.size(); ++k) {  // the op's few input storages: no hash lookup
      if (record.input_storages[k].get() == impl) {
        entries_.AddRecordRefs(*entries[k], delta);
        return;
      }
    }
    if (Entry* entry = entries_.Find(impl)) entries_.AddRecordRefs(*entry, delta);
  };
  for (const auto& storage : record.input_storages) count(storage.get());
  for (const c10::IValue& value : record.arguments) {
    ForEachTensor(value, [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) count(t.storage().unsafeGetStorageImpl());
    });
  }
}

void EngineBridge::HoldRecordRefs(ReplayOp& replay, std::span<Entry* const> entries) {
  const OpRecord& record = replay.record;
  const std::size_t n = record.input_storages.size();
  absl::InlinedVector<std::int32_t, 4>& refs = replay.input_refs;
  refs.assign(n, 1);
  bool per_input = entries.size() == n;
  for (const c10::IValue& value : record.arguments) {
    ForEachTensor(value, [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
      for (std::size_t k = 0; k < n; ++k) {
        if (record.input_storages[k].get() == impl) {
          ++refs[k];
          return;
        }
      }
      per_input = false;  // not one of its input storages: counted by lookup, now and when it is dropped
    });
  }
  if (!per_input) {
    refs.clear();
    CountRecordRefs(record, 1, entries);
    return;
  }
  for (std::size_t k = 0; k < n; ++k) entries_.AddRecordRefs(*entries[k], refs[k]);
}

void EngineBridge::ReleaseRecordRefs(const ReplayOp& replay) {
  const OpRecord& record = replay.record;
  if (replay.input_refs.size() != record.input_storages.size()) {
    CountRecordRefs(record, -1);
    return;
  }
  for (std::size_t k = 0; k < record.input_storages.size(); ++k) {
    if (Entry* entry = entries_.Find(record.input_storages[k].get())) {
      entries_.AddRecordRefs(*entry, -replay.input_refs[k]);
    }
  }
}

void EngineBridge::Prune() {
  SweepUnheld();  // a record whose outputs all died is dropped only once the engine knows
  engine_->CollectDead();
  DropInertRecords();
  entries_.EraseIf([&](Entry& entry) {
    if (!entry.released || entry.record_refs > 0) return false;
    if (entry.kept) {  // no record reads it any more: the engine lets it go; its memory goes with the StorageImpl
      ForgetKeptConstant(entry);
      engine_->Release(entry.root);
    }
    if (entry.weak.use_count() > 0) return false;
    const StorageIndex s = engine_->StorageOf(entry.root);
    if (links_.Owner(s) == entry.key) links_.ClearOwner(s);
    ++stats_.pruned_entries;
    return true;
  });
  DropInertRecords();  // releasing kept constants above may have made more ops inert
  Recycle();
}

// Drops the records of ops the engine can no longer replay (Engine::OpInert: each output dead or pinned), with the
// references they hold and their places in the reader lists.
void EngineBridge::DropInertRecords() {
  // Dropped records leave their inputs' reader lists in one pass per list afterwards: a constant every op reads
  // has a list as long as the records kept since the last prune.
  read_by_dropped_.clear();
  const std::size_t dropped = records_.DropInert(*engine_, executor_, [&](const ReplayOp& replay) {
    ReleaseRecordRefs(replay);
    for (const TensorId t : replay.inputs) {
      if (t != kNoIndex) read_by_dropped_.push_back(engine_->StorageOf(t));
    }
  });
  if (dropped == 0) return;
  stats_.pruned_records += static_cast<std::int64_t>(dropped);
  links_.DropReaders(read_by_dropped_, [&](OpId op) { return records_.Dropped(op); });
  records_.ClearDropped();
}

// The engine recycles what nothing can need (Engine::Recycle); the ids it frees will name other ops and storages,
// so every reference the bridge and the executor keep under them goes. Prune has dropped the records of inert ops
// just before; an op whose record is still kept is not recycled (it waits for the next prune).
void EngineBridge::Recycle() {
  const RecycledIds ids = engine_->Recycle([&](OpId op) { return executor_.Op(op) != nullptr; });
  if (ids.storages.empty() && ids.ops.empty()) return;
  const absl::flat_hash_set<TensorId> tensors(ids.tensors.begin(), ids.tensors.end());
  for (const StorageIndex s : ids.storages) {
    const c10::StorageImpl* owner = links_.Owner(s);
    links_.Forget(s);
    if (owner == nullptr) continue;
    Entry* entry = entries_.Find(owner);
    // A released entry whose StorageImpl has not gone yet: its engine storage is gone, so it goes too.
    if (entry != nullptr && tensors.contains(entry->root)) {
      TORCH_CHECK(entry->released, "remat: the engine recycled a storage a live tensor holds");
      entries_.Erase(*entry);
      ++stats_.pruned_entries;
    }
  }
  executor_.Forget(ids);
}


absl::Status EngineBridge::FixEntry(Entry& entry) {
  if (!engine_->Defined(entry.root) || engine_->Paged(engine_->StorageOf(entry.root))) {
    if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) return status;
  }
  executor_.WillRead(*engine_, engine_->StorageOf(entry.root));  // an export reads it: after a prefetch's copy
  PinEntry(entry);
  engine_->Fix(entry.root);
  return absl::OkStatus();
}

namespace {

absl::Status UntrackedEvictedError() {
  return absl::FailedPreconditionError("remat: an evicted storage remat no longer tracks cannot be brought back");
}

}  // namespace

absl::Status EngineBridge::MakeResident(c10::StorageImpl* impl, bool writable) {
  std::lock_guard<EngineLock> lock(lock_);
  const Export kind = writable ? Export::kWritable : Export::kRead;
  return InsideOpKernel() ? ExportInsideOp(impl, kind) : ExportLocked(impl, kind);
}

absl::Status EngineBridge::StorageWillChange(c10::StorageImpl* impl) {
  std::lock_guard<EngineLock> lock(lock_);
  return InsideOpKernel() ? ExportInsideOp(impl, Export::kWillChange) : ExportLocked(impl, Export::kWillChange);
}

bool EngineBridge::InsideOpKernel() { return current_.active && lock_.LentByThisThread(); }

absl::Status EngineBridge::ExportLocked(c10::StorageImpl* impl, Export kind) {
  Entry* found = entries_.Find(impl);
  if (found == nullptr || found->released) {
    if (kind != Export::kWillChange && IsEvicted(*impl)) {
      return UntrackedEvictedError();
    }
    // Not remat's: a constant made outside its view keeps its memory anyway. Written through the export (a parameter
    // made before enable, exported before any op read it), it is tracked from now on as exported, so that the ops
    // that read it later are not replayed.
    if (kind == Export::kWritable && found == nullptr && impl->device_type() == memory_->device_type() &&
        !impl->sym_nbytes().is_heap_allocated() && impl->nbytes() > 0) {
      EntryFor(impl).exported = true;
    }
    return absl::OkStatus();
  }
  Entry& entry = *found;
  if (absl::Status status = FixEntry(entry); !status.ok()) return status;
  const StorageIndex s = engine_->StorageOf(entry.root);
  if (kind == Export::kWillChange) {
    engine_->SetAddress(s, 0);  // the block is about to be freed or replaced: the engine must not use its address
    PinDependents(s, {.writer = {}, .event = "was freed or replaced"});
    return absl::OkStatus();
  }
  // share_memory_() moves the bytes out of the arena: the engine must not take the old address for this storage.
  engine_->SetAddress(s, memory_->Owns(impl->_mutable_data_ptr_no_checks()) ? AddressOf(*impl) : 0);
  if (kind == Export::kWritable && !entry.exported) {
    entry.exported = true;
    // What was computed from the bytes as they are now stays as it is.
    PinDependents(s, {.writer = {}, .event = "was exported writable"});
  }
  return absl::OkStatus();
}

// The storages of the op in flight are resident and held while its kernel runs, but the engine is between BeginOp
// and EndOp: an input written in place is about to get a new version, a blank one it overwrites has left the
// engine, its outputs are not tracked yet. Their export waits for the end of the op (ApplyExportsFromInsideOp).
// Any other storage is exported now, with the lock taken back from borrowers meanwhile.
absl::Status EngineBridge::ExportInsideOp(c10::StorageImpl* impl, Export kind) {
  Entry* found = entries_.Find(impl);
  const bool tracked = found != nullptr && !found->released;
  const bool of_the_op = !tracked || std::find(current_.input_entries.begin(), current_.input_entries.end(),
                                               found) != current_.input_entries.end();
  if (of_the_op) {
    if (!tracked && kind != Export::kWillChange && IsEvicted(*impl)) {
      return UntrackedEvictedError();
    }
    current_.exports_inside.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl), kind);
    return absl::OkStatus();
  }
  EngineLock::LendPause pause(lock_);
  return ExportLocked(impl, kind);
}

void EngineBridge::ApplyExportsFromInsideOp() {
  for (const auto& [impl, kind] : current_.exports_inside) {
    if (absl::Status status = ExportLocked(impl.get(), kind); !status.ok()) Throw(status);
  }
  current_.exports_inside.clear();
}

absl::Status EngineBridge::MaterializeLive() {
  std::lock_guard<EngineLock> lock(lock_);
  // Storages whose last reference died since the last op need no bytes. (Nothing below sweeps again: MakeRoom
  // sweeps only when an op ran since the last SweepUnheld, so the walks below see lists that stay put.)
  Sweep();
  SweepUnheld();
  // What comes back is pinned, and a pinned storage could be paged out again to make room for the next one (with
  // page_constants): nothing may leave the device from here on.
  const bool page_constants = engine_->page_constants();
  engine_->SetPageConstants(false);
  absl::Status result = absl::OkStatus();
  entries_.ForEachLive([&](Entry& entry) {
    if (entry.released) return;
    if (entry.pinned) {  // a paged constant comes back from its host copy
      if (engine_->Paged(engine_->StorageOf(entry.root))) {
        if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok() && result.ok()) result = status;
      }
      return;
    }
    // Pinned as it comes back, so that bringing back the next one cannot evict it again.
    if (!engine_->Defined(entry.root)) {
      if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) {
        if (result.ok()) result = status;
        return;
      }
    }
    engine_->Pin(entry.root);
    entry.pinned = true;
  });
  engine_->SetPageConstants(page_constants);
  if (!result.ok()) return result;
  // Nothing may stay in the host tier, which dies with the bridge.
  std::int64_t paged_bytes = 0;
  int paged = 0;
  entries_.ForEachLive([&](const Entry& entry) {
    if (entry.released || !engine_->Paged(engine_->StorageOf(entry.root))) return;
    ++paged;
    paged_bytes += static_cast<std::int64_t>(entry.key->nbytes());
  });
  if (paged > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("remat: ", paged, " storages still held (", paged_bytes,
                                                     " bytes) are in the host tier and do not fit back in the budget"));
  }
  return absl::OkStatus();
}

}  // namespace remat::integration
