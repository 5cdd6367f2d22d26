#include "integration/storage_entries.h"

#include <c10/util/Exception.h>

namespace remat::integration {

StorageEntries::Entry& StorageEntries::Add(const c10::intrusive_ptr<c10::StorageImpl>& impl) {
  Entry* entry = nullptr;
  if (free_.empty()) {
    entry = &store_.emplace_back();
  } else {
    entry = free_.back();
    free_.pop_back();
  }
  entry->key = impl.get();
  entry->weak = c10::weak_intrusive_ptr<c10::StorageImpl>(impl);
  map_.emplace(impl.get(), entry);
  Append(unheld_, *entry);
  return *entry;
}

void StorageEntries::Append(LiveList& list, Entry& entry) {
  entry.live_slot = static_cast<std::uint32_t>(list.slots.size());
  entry.in_held_list = &list == &held_;
  list.slots.push_back(LiveSlot{const_cast<c10::StorageImpl*>(entry.key), entry.record_refs});
  list.entries.push_back(&entry);
}

void StorageEntries::AddRecordRefs(Entry& entry, std::int64_t delta) {
  TORCH_CHECK(!sweeping_, "remat: record references changed during a sweep of the storage entries");
  entry.record_refs += delta;
  if (entry.live_slot == kNotLive) return;
  LiveList& from = entry.in_held_list ? held_ : unheld_;
  if ((entry.record_refs > 0) == entry.in_held_list) {
    from.slots[entry.live_slot].record_refs = entry.record_refs;
    return;
  }
  from.slots[entry.live_slot] = LiveSlot{nullptr, 0};  // a hole, closed by that list's next sweep
  from.entries[entry.live_slot] = nullptr;
  Append(entry.in_held_list ? unheld_ : held_, entry);
}

StorageEntries::Entry& StorageEntries::At(const c10::StorageImpl* impl) const {
  Entry* entry = Find(impl);
  TORCH_CHECK(entry != nullptr, "remat: a storage the bridge should track has no entry");
  return *entry;
}

void StorageEntries::Erase(Entry& entry) {
  TORCH_CHECK(entry.live_slot == kNotLive, "remat: a live storage entry cannot be erased");
  map_.erase(entry.key);
  entry = Entry{};
  free_.push_back(&entry);
}

}  // namespace remat::integration
