// EngineBridge, its storage entries (engine_bridge.h, "Storages", "Last references", "Writes to constants",
// "Pruning"): mapping StorageImpls to engine tensors, sweeping for last references, pinning what a changing constant
// feeds, pruning records and recycling with the engine, exports (MakeResident, StorageWillChange) and bringing
// everything back before remat is switched off (MaterializeLive).
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "integration/engine_bridge.h"
#include "integration/engine_bridge_internal.h"
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
  entry.key = impl;
  Entry& placed = entries_.emplace(impl, std::move(entry)).first->second;
  AddLive(placed);
  return placed;
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
    NotePinned(impl.get());
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

void EngineBridge::AddLive(Entry& entry) {
  entry.live_slot = static_cast<std::uint32_t>(live_.size());
  // Sweep reads the count through the non-const raw API; nothing is written.
  live_.push_back(LiveSlot{const_cast<c10::StorageImpl*>(entry.key), entry.record_refs});
  live_entries_.push_back(&entry);
}

void EngineBridge::Sweep() {
  LiveSlot* live = live_.data();
  const std::size_t n = live_.size();
  // The common case inline (a user still holds it): a few instructions per live storage, no call, and no store
  // until the first entry that may go. The entry's weak reference keeps the StorageImpl's memory, so its count
  // can be read.
  auto held = [](const LiveSlot& slot) {
    return static_cast<std::int64_t>(c10::raw::intrusive_ptr::use_count(slot.impl)) > slot.record_refs;
  };
  std::size_t i = 0;
  while (i < n && held(live[i])) ++i;
  if (i == n) return;
  Entry** entries = live_entries_.data();
  std::size_t kept = i;
  for (; i < n; ++i) {
    Entry* entry = entries[i];
    if (!held(live[i])) {
      ReleaseIfDead(*entry);
      if (entry->released) {
        entry->live_slot = kNotLive;
        continue;
      }
    }
    live[kept] = live[i];
    entries[kept] = entry;
    entry->live_slot = static_cast<std::uint32_t>(kept);
    ++kept;
  }
  live_.resize(kept);
  live_entries_.resize(kept);
}

void EngineBridge::ReleaseIfDead(Entry& entry) {
  if (entry.released || static_cast<std::int64_t>(entry.weak.use_count()) > entry.record_refs) return;
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
      return;
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

bool EngineBridge::PinState(c10::StorageImpl* impl) {
  std::lock_guard<EngineLock> lock(lock_);
  auto it = entries_.find(impl);
  if (it == entries_.end() || it->second.pinned || it->second.released) return false;
  PinEntry(it->second);
  ++stats_.pinned_state;
  return true;
}

void EngineBridge::CountRecordRefs(const OpRecord& record, int delta, std::span<Entry* const> entries) {
  auto count = [&](const c10::StorageImpl* impl) {
    for (std::size_t k = 0; k < entries.size(); ++k) {  // the op's few input storages: no hash lookup
      if (record.input_storages[k].get() == impl) {
        AddRecordRefs(*entries[k], delta);
        return;
      }
    }
    auto it = entries_.find(impl);
    if (it != entries_.end()) AddRecordRefs(it->second, delta);
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
  DropInertRecords();
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
  DropInertRecords();  // releasing kept constants above may have made more ops inert
  Recycle();
}

// Drops the records of ops the engine can no longer replay (Engine::OpInert: each output dead or pinned), with the
// references they hold and their places in the reader lists.
void EngineBridge::DropInertRecords() {
  std::size_t kept = 0;
  // Dropped records leave their inputs' reader lists in one pass per list afterwards: a constant every op reads
  // has a list as long as the records kept since the last prune.
  std::vector<OpId> dropped_ops;
  std::vector<StorageIndex> read_storages;
  for (const OpId op : kept_ops_) {
    if (executor_.Op(op) == nullptr) continue;
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
    if (spare_replays_.size() < kMaxSpareReplays) {
      // Its references go now, as if it were destroyed (a storage's death is its use count); the rest is
      // overwritten when it is reused.
      OpRecord& r = dropped->record;
      r.arguments.clear();
      r.input_storages.clear();
      r.outputs.clear();
      r.rng.reset();
      spare_replays_.push_back(std::move(dropped));
    }
  }
  kept_ops_.resize(kept);
  if (dropped_ops.empty()) return;
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
}

// The engine recycles what nothing can need (Engine::Recycle); the ids it frees will name other ops and storages,
// so every reference the bridge and the executor keep under them goes. Prune has dropped the records of inert ops
// just before; an op whose record is still kept is not recycled (it waits for the next prune).
void EngineBridge::Recycle() {
  const RecycledIds ids = engine_->Recycle([&](OpId op) { return executor_.Op(op) != nullptr; });
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
  for (Entry* live : live_entries_) {
    Entry& entry = *live;
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
  for (const Entry* entry : live_entries_) {
    if (entry->released || !engine_->Paged(engine_->StorageOf(entry->root))) continue;
    ++paged;
    paged_bytes += static_cast<std::int64_t>(entry->key->nbytes());
  }
  if (paged > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("remat: ", paged, " storages still held (", paged_bytes,
                                                     " bytes) are in the host tier and do not fit back in the budget"));
  }
  return absl::OkStatus();
}

}  // namespace remat::integration
