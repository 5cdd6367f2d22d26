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
  entry->live_slot = static_cast<std::uint32_t>(live_.size());
  live_.push_back(LiveSlot{impl.get(), entry->record_refs});
  live_entries_.push_back(entry);
  return *entry;
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
