// StorageEntries: the bridge's table of the StorageImpls it tracks (engine_bridge.h, "Storages", "Last references").
//
// Contract:
//   - One Entry per tracked c10::StorageImpl, found by its address (Find). An entry stays at the same address from Add
//     until Erase (callers keep Entry* across ops: the in-flight op's inputs, the live list); erased entries are
//     reused by later Adds (no allocation per tracked storage once the table has grown).
//   - The live lists: the entries not released, in two lists by whether kept records hold their storage
//     (record_refs > 0). Add appends to the unheld list; AddRecordRefs moves an entry to the other list's end when
//     its record_refs crosses zero (it leaves a hole in the old list, which the next sweep of that list closes).
//     Sweeps keep each list's order. SweepHeld visits, in order, every entry of the held list whose storage nobody
//     but the records holds any more (its use count is no more than record_refs), calls `release(entry)`, and
//     drops from the list those it marked released; SweepUnheld does the same over the unheld list (an entry there
//     is dead when its use count is 0). A sweep reads a dense array (each StorageImpl's address and a copy of
//     record_refs), so the common case, a live entry a user still holds, costs a few instructions and one read of
//     the StorageImpl.
//   - Why two lists: a storage records hold keeps its memory after its last user lets it go, until the bridge
//     releases it (every op must look); a storage nobody's record holds gave its memory back through torch's own
//     free the moment it died, so telling the engine can wait (EngineBridge::Sweep says until when).
//   - record_refs, the strong references kept records hold on the storage, changes only through AddRecordRefs, never
//     from inside a sweep's `release` (checked).
//   - Nothing here talks to the engine: what an entry's fields mean (its engine tensor, pins, blanks) is the bridge's.
#pragma once

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "integration/held_references.h"
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
    // Released, but its memory kept because records read it (EngineBridge::ReleaseIfDead), small (under
    // kKeptConstantMaxBytes, with a cap on them all) or not.
    bool kept = false;
    bool kept_small = false;
    // Exported writable (MakeResident): its bytes may change behind remat's back; ops reading it are not replayed.
    bool exported = false;
    // Its current version was made by a backward-pass op (a gradient): the optimizer step reads it anyway.
    bool from_backward = false;
    // In-place writes of it since it was made (EngineBridge::AfterOp): each version's replay starts from the one
    // before, so a long chain is state (a key/value cache filled token by token), kept as a constant.
    std::uint32_t in_place_writes = 0;

   private:
    friend class StorageEntries;
    std::uint32_t live_slot = kNotLive;  // its place in its live list, else kNotLive
    bool in_held_list = false;           // which list: held (record_refs > 0) or unheld
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
  // A fresh entry for `impl` (not tracked yet), holding a weak reference to it, appended to the unheld list.
  Entry& Add(const c10::intrusive_ptr<c10::StorageImpl>& impl);
  // Forgets a released entry (not on the live list); its slot is reused.
  void Erase(Entry& entry);
  std::size_t size() const { return map_.size(); }

  void AddRecordRefs(Entry& entry, std::int64_t delta);

  // See the contract. `release(Entry&)` may mark the entry released (it then leaves its list) or not; it must not
  // add or erase entries, nor change record_refs.
  template <typename Release>
  void SweepHeld(Release release) {
    Sweep(held_, release);
  }
  template <typename Release>
  void SweepUnheld(Release release) {
    Sweep(unheld_, release);
  }
  // A sweep's `release` is running (a nested sweep would change a list the outer one walks).
  bool sweeping() const { return sweeping_; }
  // Calls visit(Entry&) for every live entry: the held list, then the unheld list, each in order (holes skipped).
  template <typename Visit>
  void ForEachLive(Visit visit) const;
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
  // A hole (an entry moved to the other list) has impl == nullptr: never held, so a sweep stops there and closes it.
  static bool Held(const LiveSlot& slot) {
    // The entry's weak reference keeps the StorageImpl's memory, so its count can be read.
    return slot.impl != nullptr &&
           HeldBeyond(*slot.impl, static_cast<std::int64_t>(c10::raw::intrusive_ptr::use_count(slot.impl)),
                      slot.record_refs);
  }
  struct LiveList {
    std::vector<LiveSlot> slots;
    std::vector<Entry*> entries;  // per slot: its entry (nullptr for a hole)
  };
  void Append(LiveList& list, Entry& entry);
  template <typename Release>
  void Sweep(LiveList& list, Release release);

  absl::flat_hash_map<const c10::StorageImpl*, Entry*> map_;
  std::deque<Entry> store_;   // every entry ever made (a deque: addresses stay put as it grows)
  std::vector<Entry*> free_;  // erased entries, for reuse
  LiveList held_;
  LiveList unheld_;
  bool sweeping_ = false;  // a sweep's release is running: record_refs must not change (the lists would move)
};

template <typename Release>
void StorageEntries::Sweep(LiveList& list, Release release) {
  LiveSlot* live = list.slots.data();
  const std::size_t n = list.slots.size();
  // The common case inline: no call and no store until the first entry that may go.
  std::size_t i = 0;
  while (i < n && Held(live[i])) ++i;
  if (i == n) return;
  Entry** entries = list.entries.data();
  std::size_t kept = i;
  sweeping_ = true;
  for (; i < n; ++i) {
    Entry* entry = entries[i];
    if (entry == nullptr) continue;  // a hole
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
  sweeping_ = false;
  list.slots.resize(kept);
  list.entries.resize(kept);
}

template <typename Visit>
void StorageEntries::ForEachLive(Visit visit) const {
  for (const LiveList* list : {&held_, &unheld_}) {
    for (Entry* entry : list->entries) {
      if (entry != nullptr) visit(*entry);
    }
  }
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
