// Held references: how many strong references remat itself holds on a StorageImpl (the op records the engine
// keeps for replays hold their inputs), so that an observer can tell when the user's last reference is gone:
// a storage is dead to the user when its use count is no more than what remat holds (HeldBeyond).
//
// One more reference is not the user's: the storage's Python object (a torch.UntypedStorage, made by
// `untyped_storage()`, `torch.save`, `deepcopy`, ...) holds one strong reference, and while any C++ reference
// remains torch keeps that object alive with one Python reference of its own (PyObject preservation,
// c10/util/intrusive_ptr.h). Once the program has dropped the object, it is reachable only through the storage,
// and remat's records alone would keep the pair alive: never released, its memory held until the records go.
//
// The engine bridge installs its counter while it is alive (SetHeldReferences) and removes it (nullptr) before
// it goes; without one every reference is the user's. The counter is called on the thread of the op being
// observed, with the installer's own locks held as it chooses; it must be cheap and must not call back into
// the dispatcher.
#pragma once

#include <c10/core/StorageImpl.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <c10/util/intrusive_ptr.h>

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

// Whether anything but `held` of remat's references and the storage's own preserved Python object holds the
// storage whose use count is `uses` (header). Reads the Python object's count only when that one reference decides.
inline bool HeldBeyond(const c10::StorageImpl& storage, std::int64_t uses, std::int64_t held) {
  if (uses != held + 1 || uses < 2) return uses > held;  // with one use, a Python object is the program's own
  const c10::impl::PyObjectSlot* slot = storage.pyobj_slot();
  // With two uses or more torch holds exactly one Python reference on the object: a count of one is torch's.
  return slot->load_pyobj() == nullptr || !slot->has_unique_reference();
}

// The storage has no user reference left (it may still be alive because remat holds it).
inline bool DeadToTheUser(const c10::weak_intrusive_ptr<c10::StorageImpl>& storage, const c10::StorageImpl* raw) {
  const auto strong = static_cast<std::int64_t>(storage.use_count());
  return strong == 0 || !HeldBeyond(*raw, strong, HeldReferences(raw));
}

}  // namespace remat::integration
