// DeviceRouter: the dispatch hook's observer when engines run on several devices (issue 19, "Every device"): each op
// goes to the engine (EngineBridge) of the device its tensors live on. With one engine the session makes that bridge
// the observer itself and no router exists: the common case pays nothing for routing.
//
// Which device an op is on, decided before it runs (Decide):
//   - a storage is on the device whose memory says so (DeviceMemory::OnThisDevice: on CUDA the storage's device
//     index, evicted or not); where that cannot tell (CPU tensors over a device's memory, the CUDA runtime's test
//     double, whose evicted storages have no bytes to place), on the device whose engine evicted or paged it
//     (EngineBridge::HoldsOutOfMemory). Storages on no engine's device (CPU tensors, a device without an engine) are
//     constants for whichever engine records the op, as with one engine.
//   - the destination, the engine that records the op (its outputs and in-place writes are that engine's): the device
//     of the storages it writes (copy_'s `self`, out= arguments); else that of its Device argument (aten::_to_copy's
//     `device`, a factory's; without an index, the current device); else that of its tensor inputs (several: the
//     current device if it is one of them, else the lowest); else, an op with none of these (a factory of the default
//     device), the current device's. An op whose destination has no engine passes on to `next` (the session's
//     tracker, which counts it) and no engine sees it.
//   - the sources: the other engines whose storages it reads.
//
// Cross-device ops (a source or a foreign write: x.to("cuda:1"), dst.copy_(src) across devices). What each engine
// does, chosen so that no engine ever depends on another's evictions:
//   - each source engine brings its storages back and keeps them resident, locked and in place while the op runs
//     (EngineBridge::BeginRead), then lets them go: afterwards they are its storages like any other;
//   - the destination engine records the op as not replayable (OpRecord::replayable false): its outputs (and the new
//     value of a storage it writes in place) are constants there, kept or, with paging, paged to the host, never
//     dropped: a replay would read storages another engine may have evicted since, which no engine could bring back
//     from inside its own rematerialization. The source storages are constants in its view (outside its arena);
//   - a storage of another device that the op writes (an op writing two devices at once) is fixed there first
//     (EngineBridge::StorageWillChange: what was computed from it is pinned, it is never evicted or moved again).
// The engines' locks are taken in ascending device order (sources and destination alike) and the foreign writes'
// before any, so two threads copying in opposite directions cannot deadlock.
//
// Each engine's work, and the op's kernel, run with the destination's device current (DeviceMemory::SetCurrentDevice,
// as a CUDA kernel's device guard does; a source engine's BeginRead with its own device current); the caller's
// current device is restored when the op ends.
//
// Thread safety: ops on different devices run in parallel on different threads (each engine has its own lock). A
// thread has at most one recorded op in flight (the hook records outermost ops only), so the route of the op between
// BeforeOp and AfterOp/OpFailed is kept per thread. The engines and their memories are not owned and must outlive the
// router; the set is fixed at construction (the session makes a new router when an engine is added).
#pragma once

#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "integration/device_memory.h"
#include "integration/dispatch_hook.h"
#include "integration/engine_bridge.h"
#include "integration/held_references.h"

namespace remat::integration {

struct DeviceEngine {
  int device = 0;  // DeviceMemory::history_device(): the device index
  EngineBridge* bridge = nullptr;
  DeviceMemory* memory = nullptr;
};

// The decision for one op: indices into the router's engines, -1 for none.
struct DeviceRoute {
  int destination = -1;
  // Per source engine (ascending): the input storages it holds (indices into OpRecord::input_storages). Empty, and
  // allocating nothing, for the ops of one device.
  std::vector<std::pair<int, std::vector<int>>> sources;
  // Storages of other engines the op writes: (engine, input storage index).
  absl::InlinedVector<std::pair<int, int>, 1> foreign_writes;
  bool cross_device() const { return !sources.empty() || !foreign_writes.empty(); }
};

class DeviceRouter final : public OpObserver, public HeldReferenceCounter {
 public:
  // `engines`: at least one, distinct devices, in ascending device order. `next` (the session's tracker) sees the ops
  // no engine records; the bridges tell it about theirs.
  DeviceRouter(std::vector<DeviceEngine> engines, OpObserver* next);

  void BeforeOp(OpRecord& record) override;
  void AfterOp(OpRecord&& record) override;
  void OpFailed(OpRecord& record) noexcept override;
  bool RetryAfterOutOfMemory(OpRecord& record) override;
  // Asks each engine: only the one whose allocation failed has a request to make a hole for.
  bool RetryCompositeAfterOutOfMemory() override;
  // Each engine holds the storages on its device (EngineOf), in ascending device order; the others are no engine's.
  void BeginComposite(std::span<c10::StorageImpl* const> read_raw, std::span<c10::StorageImpl* const> passed_on,
                      CompositeHold& hold) override;
  void EndComposite(CompositeHold& hold) noexcept override;
  // The sum over the engines (each holds references only through its own records).
  std::int64_t HeldReferences(const c10::StorageImpl* storage) override;

  // See the contract. Reads the calling thread's current device only when the op's tensors do not decide.
  DeviceRoute Decide(const OpRecord& record) const;
  // The engine whose device `storage` is on, or -1.
  int EngineOf(c10::StorageImpl& storage) const;
  const std::vector<DeviceEngine>& engines() const { return engines_; }

 private:
  int EngineOfDevice(int device) const;
  int CurrentEngine() const;  // the engine of the calling thread's current device, or -1

  std::vector<DeviceEngine> engines_;
  OpObserver* next_;
};

}  // namespace remat::integration
