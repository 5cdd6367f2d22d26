// Held references: how many strong references remat itself holds on a StorageImpl (the op records the engine
// keeps for replays hold their inputs), so that an observer can tell when the user's last reference is gone:
// a storage is dead to the user when its use count is no more than what remat holds.
//
// The engine bridge installs its counter while it is alive (SetHeldReferences) and removes it (nullptr) before
// it goes; without one every reference is the user's. The counter is called on the thread of the op being
// observed, with the installer's own locks held as it chooses; it must be cheap and must not call back into
// the dispatcher.
#pragma once

#include <c10/core/StorageImpl.h>

#include <atomic>
#include <cstdint>

namespace remat::integration {

class HeldReferenceCounter {
 public:
  virtual ~HeldReferenceCounter() = default;
  virtual std::int64_t HeldReferences(const c10::StorageImpl* storage) = 0;
};

namespace held_references_detail {
inline std::atomic<HeldReferenceCounter*> counter{nullptr};
}  // namespace held_references_detail

// Not owned; nullptr removes it.
inline void SetHeldReferences(HeldReferenceCounter* counter) {
  held_references_detail::counter.store(counter, std::memory_order_release);
}

inline std::int64_t HeldReferences(const c10::StorageImpl* storage) {
  HeldReferenceCounter* counter = held_references_detail::counter.load(std::memory_order_acquire);
  return counter == nullptr ? 0 : counter->HeldReferences(storage);
}

// The storage has no user reference left (it may still be alive because remat holds it).
inline bool DeadToTheUser(const c10::weak_intrusive_ptr<c10::StorageImpl>& storage, const c10::StorageImpl* raw) {
  const std::size_t strong = storage.use_count();
  return strong == 0 || static_cast<std::int64_t>(strong) <= HeldReferences(raw);
}

}  // namespace remat::integration
