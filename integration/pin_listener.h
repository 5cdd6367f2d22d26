// Pin listener: tells an observer each time the engine bridge pins a storage for good (a result remat cannot
// replay, optimizer state, what a write to a constant would change, an export), so that remat.record() can write
// it into the trace as a PIN line and remat-sim pins the same storages (runtime/trace.h).
//
// The trace recorder's owner installs a listener while a trace is being written and removes it (nullptr) before
// the listener goes. The bridge calls it on the thread of the op that pins, with its own lock held; the listener
// must be cheap and must not call back into the dispatcher.
#pragma once

#include <c10/core/StorageImpl.h>

#include <atomic>

namespace remat::integration {

class PinListener {
 public:
  virtual ~PinListener() = default;
  virtual void Pinned(const c10::StorageImpl* storage) = 0;
};

namespace pin_listener_detail {
inline std::atomic<PinListener*> listener{nullptr};
}  // namespace pin_listener_detail

// Not owned; nullptr removes it.
inline void SetPinListener(PinListener* listener) {
  pin_listener_detail::listener.store(listener, std::memory_order_release);
}

inline void NotePinned(const c10::StorageImpl* storage) {
  PinListener* listener = pin_listener_detail::listener.load(std::memory_order_acquire);
  if (listener != nullptr) listener->Pinned(storage);
}

}  // namespace remat::integration
