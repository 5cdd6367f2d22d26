// StorageEntries: the bridge's table of the StorageImpls it tracks (engine_bridge.h, "Storages", "Last references").
//
// Contract:
//   - One Entry per tracked c10::StorageImpl, found by its address (Find). An entry stays at the same address from Add
//     until Erase (callers keep Entry* across ops: the in-flight op's inputs, the live list); erased entries are
//     reused by later Adds (no allocation per tracked storage once the table has grown).
//   - The live list: the entries not released, in the order they were added (Add appends; Sweep keeps the order).
//     Sweep visits, in that order, every live entry whose storage nobody but the records holds any more (its use count
//     is no more than record_refs), calls `release(entry)`, and drops from the list those it marked released. It reads
//     a dense array (each StorageImpl's address and a copy of record_refs), so the common case, a live entry a user
//     still holds, costs a few instructions and one read of the StorageImpl.
//   - record_refs, the strong references kept records hold on the storage, changes only through AddRecordRefs (which
//     keeps the live list's copy).
//   - Nothing here talks to the engine: what an entry's fields mean (its engine tensor, pins, blanks) is the bridge's.
#pragma once

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/engine.h"

namespace remat::integration {

class StorageEntries {
 public:
  struct Entry {
    const c10::StorageImpl* key = nullptr;  // the StorageImpl it tracks (its key in the table)
    c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
    TensorId root = 0;             // engine tensor of the current version
    std::int64_t record_refs = 0;  // strong references kept records hold (AddRecordRefs)
    bool pinned = false;
    bool released = false;
    // A constant only because an uninitializing op (aten::empty) made it, not written since: an op that
    // overwrites all of it (dropout's bernoulli_ on empty_like) makes an evictable value out of it.
    bool blank = false;
    // Released, but its memory kept because records read it (a small constant: EngineBridge::ReleaseIfDead).
    bool kept = false;
    // Exported writable (MakeResident): its bytes may change behind remat's back; ops reading it are not replayed.
    bool exported = false;
    // In-place writes of it since it was made (EngineBridge::AfterOp): each version's replay starts from the one
    // before, so a long chain is state (a key/value cache filled token by token), kept as a constant.
    std::uint32_t in_place_writes = 0;

   private:
    friend class StorageEntries;
    std::uint32_t live_slot = kNotLive;  // its place in the live list, else kNotLive
  };

  StorageEntries() = default;
  StorageEntries(const StorageEntries&) = delete;
  StorageEntries& operator=(const StorageEntries&) = delete;

  // The entry of `impl`, or nullptr.
  Entry* Find(const c10::StorageImpl* impl) const {
    auto it = map_.find(impl);
    return it == map_.end() ? nullptr : it->second;
  }
  bool Contains(const c10::StorageImpl* impl) const { return map_.contains(impl); }
  // The entry of a StorageImpl known to be tracked (checked).
  Entry& At(const c10::StorageImpl* impl) const;
  // A fresh entry for `impl` (not tracked yet), holding a weak reference to it, appended to the live list.
  Entry& Add(const c10::intrusive_ptr<c10::StorageImpl>& impl);
  // Forgets a released entry (not on the live list); its slot is reused.
  void Erase(Entry& entry);
  std::size_t size() const { return map_.size(); }

  void AddRecordRefs(Entry& entry, std::int64_t delta) {
    entry.record_refs += delta;
    if (entry.live_slot != kNotLive) live_[entry.live_slot].record_refs = entry.record_refs;
  }

  // See the contract. `release(Entry&)` may mark the entry released (it then leaves the live list) or not; it must
  // not add or erase entries.
  template <typename Release>
  void Sweep(Release release);
  // The live entries, in order.
  const std::vector<Entry*>& Live() const { return live_entries_; }
  // Calls visit(Entry&) for every entry (in no particular order); entries it returns true for are erased. Such an
  // entry must be released.
  template <typename Visit>
  void EraseIf(Visit visit);

 private:
  static constexpr std::uint32_t kNotLive = ~std::uint32_t{0};
  struct LiveSlot {
    c10::StorageImpl* impl;  // non-const only for the raw use-count API; never written through
    std::int64_t record_refs;
  };
  static bool Held(const LiveSlot& slot) {
    // The entry's weak reference keeps the StorageImpl's memory, so its count can be read.
    return static_cast<std::int64_t>(c10::raw::intrusive_ptr::use_count(slot.impl)) > slot.record_refs;
  }

  absl::flat_hash_map<const c10::StorageImpl*, Entry*> map_;
  std::deque<Entry> store_;   // every entry ever made (a deque: addresses stay put as it grows)
  std::vector<Entry*> free_;  // erased entries, for reuse
  std::vector<LiveSlot> live_;
  std::vector<Entry*> live_entries_;  // per live_ slot: its entry
};

template <typename Release>
void StorageEntries::Sweep(Release release) {
  LiveSlot* live = live_.data();
  const std::size_t n = live_.size();
  // The common case inline: no call and no store until the first entry that may go.
  std::size_t i = 0;
  while (i < n && Held(live[i])) ++i;
  if (i == n) return;
  Entry** entries = live_entries_.data();
  std::size_t kept = i;
  for (; i < n; ++i) {
    Entry* entry = entries[i];
    if (!Held(live[i])) {
      release(*entry);
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

template <typename Visit>
void StorageEntries::EraseIf(Visit visit) {
  for (auto it = map_.begin(); it != map_.end();) {
    Entry* entry = it->second;
    if (!visit(*entry)) {
      ++it;
      continue;
    }
    map_.erase(it++);
    *entry = Entry{};
    free_.push_back(entry);
  }
}

}  // namespace remat::integration
