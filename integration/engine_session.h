// Engine session: remat switched on with the engine behind it (evict and rematerialize under the budget).
//
// EnableRematEngine does what EnableRemat (session.h) does (the CPU arena with the budget as a hard limit, the
// dispatch hook on for the calling thread) and puts an EngineBridge (engine_bridge.h) between the hook and the
// session's tracker: the bridge drives the engine with every op, is the arena's pressure handler, and tells the
// tracker about every op (so remat.stats() op counts and remat.record() traces keep working).
//
// DisableRematEngine switches remat off as DisableRemat does, then makes every storage a user still holds resident
// again (from torch's own allocator: together they may exceed the budget), and destroys the engine. If a storage
// cannot be brought back the error is returned (remat is off anyway) and reading that tensor raises a clear error.
// The engine's statistics stay readable until the next enable.
//
// EnableRematEngineOn does the same over memory the caller set up and hands over (a CUDA device's arena,
// integration/cuda/cuda_device_memory.h): it installs no CPU arena; the bridge becomes that memory's pressure handler.
// options.budget must be the memory's budget (the arena's size). DisableRematEngine then makes every storage a user
// still holds resident again in that memory, under its budget (there is no other allocator to spill to: a storage
// that does not fit is an error), before it detaches the bridge.
//
// One engine per device (issue 19, "Every device"): EnableRematEngineOn again with another device's memory adds an
// engine for that device (its own bridge, budget and arena; the hook is switched on for the calling thread too), and
// from the second one on the hook's observer is a DeviceRouter (device_router.h) that gives each op to the engine of
// the device its tensors live on; cross-device copies are described there. With one engine the bridge is the observer,
// as on the CPU. DisableRematEngine switches them all off (each device's storages brought back under its budget). A
// device is identified by DeviceMemory::history_device().
//
// Enable/Disable are serialized by a mutex. AlreadyExists: enabling while a CPU session runs, a CPU session while any
// runs, or a second engine on the same device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/device_memory.h"
#include "integration/engine_bridge.h"
#include "integration/host_tier.h"
#include "integration/trace_recorder.h"
#include "runtime/config.h"

namespace remat::integration {

struct EngineSessionOptions {
  std::size_t budget = 0;         // bytes; > 0
  std::string policy = "dtr-eq";  // a registered policy (PolicyNames())
  std::string costs = "measured";  // op costs: "measured" (wall time) or "estimated" (op_cost.h, reproducible)
  // Paging to a second tier (engine_bridge.h, "Paging"; host_tier.h). ResolvePaging fills the first two from
  // strings and the environment.
  OffloadMode offload = OffloadMode::kOff;
  std::int64_t host_budget = std::numeric_limits<std::int64_t>::max();  // bytes; unlimited by default
  HostTierKind host_tier = HostTierKind::kMemory;
  bool page_constants = true;  // gradients, optimizer state and pinned storages in the arena may be paged
  double bandwidth_bytes_per_s = kCpuTierBandwidthBytesPerS;  // the engine's link model (engine_bridge.h)
  std::int64_t latency_ns = kCpuTierLatencyNs;
  std::string host_tier_directory = "";  // kFile: empty for $TMPDIR, else /tmp
  // The CPU arena: 0 for one contiguous block of `budget` bytes, else a stitching arena of granules of this many
  // bytes (issue 18; cpu_allocator.h). Not used on CUDA.
  std::size_t stitch_granule = 0;
};

// Offload mode and host budget from the API's strings, else from REMAT_OFFLOAD / REMAT_HOST_BUDGET (only those two
// variables are read), parsed by runtime/config.h (ParseOffloadMode, ParseByteSize): one parsing path. A nullopt
// or empty string means "not given". InvalidArgument names the option ("offload", "host_budget") or the variable.
struct PagingSetting {
  OffloadMode offload = OffloadMode::kOff;
  std::int64_t host_budget = std::numeric_limits<std::int64_t>::max();
};
absl::StatusOr<PagingSetting> ResolvePaging(const std::optional<std::string>& offload,
                                            const std::optional<std::string>& host_budget);

absl::Status EnableRematEngine(const EngineSessionOptions& options);
absl::Status EnableRematEngineOn(const EngineSessionOptions& options, std::unique_ptr<DeviceMemory> memory);
absl::Status DisableRematEngine();
bool RematEngineEnabled();
// The devices with an engine now, ascending (-1: the CPU session).
std::vector<int> RematEngineDevices();
// The calls below go to the engine of the storage's device (with one engine: that engine).
// Pins the storages of `tensors` for good (EngineBridge::PinState): state kept across steps, such as an optimizer's.
// Returns how many were pinned; FailedPrecondition when remat is not enabled.
absl::StatusOr<int> PinRematState(const std::vector<at::Tensor>& tensors);
// For code that reads or keeps a tensor's bytes outside torch ops (a raw data pointer, an export): brings its storage
// back if remat evicted or paged it, and keeps it resident and in place for as long as it lives
// (EngineBridge::MakeResident; `writable`: the caller may write the bytes too). Nothing to do when remat is off.
absl::Status MakeResident(const at::Tensor& tensor, bool writable = true);
// For code that is about to resize or replace a storage outside torch ops (UntypedStorage.resize_): pins what was
// computed from its current bytes (EngineBridge::StorageWillChange). Nothing to do when remat is off.
absl::Status StorageWillChange(const c10::Storage& storage);
// The end of a training iteration (EngineBridge::MarkStep: plan mode's recording, planning and following). Nothing
// to do when remat is off or the policy is not "plan".
void MarkRematStep();
// What every engine's memory holds now (EngineBridge::HeldStorages), for a recording that starts now; empty when
// remat runs without the engine.
std::vector<c10::intrusive_ptr<c10::StorageImpl>> RematHeldStorages();
// For a recording that starts now: whether a storage's bytes count against a budget (EvictableMemory in the memory of
// an engine that exists now, as plan mode's recording counts them); null when remat runs without the engine. Valid
// until DisableRematEngine, which stops the recording before it deletes the memories.
TraceRecorder::CountsAgainstBudget RematBudgetedMemory();
// Plan mode: the recorded iteration the last plan was made from, as a trace (empty when none); with engines on several
// devices, the lowest device's. MarkRematStep ends the iteration on every engine.
std::string RematPlannedTrace();
// Of the current engine, else of the last one; NotFound before the first EnableRematEngine; FailedPrecondition when
// engines run (or ran last) on several devices: ask per device.
absl::StatusOr<BridgeStats> GetEngineStats();
// Of the engine on `device` (-1: the CPU), now or in the last session; NotFound when it had none.
absl::StatusOr<BridgeStats> GetEngineStats(int device);
struct DeviceEngineStats {
  int device = -1;
  BridgeStats stats;
};
// Of every engine now, else of the last session's, in ascending device order; empty before the first enable.
std::vector<DeviceEngineStats> GetAllEngineStats();

// Enables remat with the engine for its lifetime (LibTorch programs); throws c10::Error when that fails.
class EngineGuard {
 public:
  explicit EngineGuard(const EngineSessionOptions& options);
  ~EngineGuard();
  EngineGuard(const EngineGuard&) = delete;
  EngineGuard& operator=(const EngineGuard&) = delete;
};

}  // namespace remat::integration
