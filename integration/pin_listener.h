// Pin listener: tells an observer each time the engine bridge pins a storage for good (a result remat cannot
// replay, optimizer state, what a write to a constant would change, an export), so that remat.record() can write
// it into the trace as a PIN line and remat-sim pins the same storages (runtime/trace.h).
//
// Two listeners at most, one per slot: the trace recorder's owner (remat.record()) and plan mode's recorder of the
// running iteration (integration/plan_driver.h); each installs its listener while it records and removes it
// (nullptr) before the listener goes. The bridge calls it on the thread of the op that pins, with its own lock held; the listener
// must be cheap and must not call back into the dispatcher.
#pragma once

#include <c10/core/StorageImpl.h>

#include <atomic>

namespace remat::integration {

class PinListener {
 public:
  virtual ~PinListener() = default;
  virtual void Pinned(const c10::StorageImpl* storage) = 0;
  // The op about to run overwrites all of `storage`, a blank constant, which leaves the engine: the op makes its
  // new value (engine_bridge.h, "Writes to constants").
  virtual void BlankOverwritten(const c10::StorageImpl* storage) {}
};

enum class PinListenerSlot { kTrace = 0, kPlan = 1 };

namespace pin_listener_detail {
inline std::atomic<PinListener*> listeners[2] = {nullptr, nullptr};

template <typename Call>
void ForEachListener(Call call) {
  for (std::atomic<PinListener*>& slot : listeners) {
    if (PinListener* listener = slot.load(std::memory_order_acquire); listener != nullptr) call(*listener);
  }
}
}  // namespace pin_listener_detail

// Not owned; nullptr removes it.
inline void SetPinListener(PinListener* listener, PinListenerSlot slot = PinListenerSlot::kTrace) {
  pin_listener_detail::listeners[static_cast<int>(slot)].store(listener, std::memory_order_release);
}

inline void NotePinned(const c10::StorageImpl* storage) {
  pin_listener_detail::ForEachListener([&](PinListener& l) { l.Pinned(storage); });
}

inline void NoteBlankOverwritten(const c10::StorageImpl* storage) {
  pin_listener_detail::ForEachListener([&](PinListener& l) { l.BlankOverwritten(storage); });
}

}  // namespace remat::integration
