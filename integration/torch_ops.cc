// The torch ops the Python package calls (torch.ops.remat.*). Registered when torch.ops.load_library loads
// libremat_torch.so. Errors surface as Python exceptions: RuntimeError for misuse, torch.OutOfMemoryError from
// allocations. Thin wrappers over session.h; no logic here.
#include <ATen/core/Dict.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "integration/cpu_allocator.h"
#include "integration/dispatch_hook.h"
#include "integration/engine_session.h"
#include "integration/opaque_call.h"
#include "integration/session.h"
#include "runtime/config.h"

namespace remat::integration {
namespace {

void ThrowIfError(const absl::Status& status) { TORCH_CHECK(status.ok(), std::string(status.message())); }

void Enable(int64_t budget) {
  TORCH_CHECK(budget > 0, "remat: budget must be a positive number of bytes, got ", budget);
  ThrowIfError(EnableRemat(RematOptions{static_cast<std::size_t>(budget)}));
}

void Disable() { ThrowIfError(DisableRemat()); }

bool IsEnabled() { return RematEnabled(); }

c10::Dict<std::string, int64_t> Stats() {
  ThrowIfError(TraceWriteStatus());
  const RematStats s = GetRematStats();
  c10::Dict<std::string, int64_t> out;
  auto put = [&](const char* name, auto value) { out.insert(name, static_cast<int64_t>(value)); };
  put("enabled", s.enabled);
  if (s.has_arena) {
    put("budget", s.arena.budget);
    put("allocated_bytes", s.arena.allocated_bytes);
    put("peak_allocated_bytes", s.arena.peak_allocated_bytes);
    put("reserved_bytes", s.arena.reserved_bytes);
    put("free_bytes", s.arena.free_bytes);
    put("largest_free_block", s.arena.largest_free_block);
    put("allocations", s.arena.allocations);
    put("frees", s.arena.frees);
    put("pressure_allocations", s.arena.pressure_allocations);
    put("failed_allocations", s.arena.failed_allocations);
    put("search_ns", s.arena.search_ns);
    if (s.arena.granule > 0) {  // a stitching arena: the budget counts granules in use
      put("granule", s.arena.granule);
      put("physical_bytes", s.arena.physical_bytes);
      put("peak_physical_bytes", s.arena.peak_physical_bytes);
    }
  }
  put("ops_recorded", s.ops_recorded);
  put("random_ops_recorded", s.random_ops_recorded);
  put("op_time_ns", s.op_time_ns);
  return out;
}

void ResetPeak() { ThrowIfError(ResetCpuArenaPeak()); }

// The calling thread's ops go through the hook (or no longer do): remat.enable() tracks the threads started after it.
void TrackThisThread(bool enabled) { ThrowIfError(SetHookEnabledOnThisThread(enabled)); }

// The budget as users write it (runtime/config.h: "512MiB", "4096", or a fraction such as "0.5"), in bytes. On
// CPU a fraction is of the machine's physical memory.
int64_t ParseBudgetBytes(const std::string& text) {
  absl::StatusOr<BudgetSetting> budget = ParseBudget(text);
  ThrowIfError(budget.status());
  const std::uint64_t physical =
      static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t bytes = budget->Resolve(physical);
  TORCH_CHECK(bytes > 0 && bytes <= static_cast<std::uint64_t>(INT64_MAX), "remat: budget \"", text,
              "\" resolves to ", bytes, " bytes");
  return static_cast<int64_t>(bytes);
}

// What the engine holds when the recording starts is declared in it (last step's gradients, optimizer state): a
// recording started mid-run replays with the memory the program keeps. Memory outside the engines' budgets (a model
// built before enable) is 0 bytes in it: a replay at the run's budget charges what the run charged.
void RecordStart(const std::string& path, bool estimated_costs) {
  ThrowIfError(StartTrace(path, estimated_costs, RematHeldStorages(), RematBudgetedMemory()));
}

int64_t RecordStop() {
  absl::StatusOr<std::uint64_t> ops = StopTrace();
  ThrowIfError(ops.status());
  return static_cast<int64_t>(*ops);
}

std::string TorchVersion() { return absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR); }

// A torch.compile'd graph's call, as one op (opaque_call.h).
void OpaqueCallBegin(const std::vector<at::Tensor>& written, const std::vector<at::Tensor>& read, int64_t graph,
                     const std::vector<at::Tensor>& snapshot) {
  BeginOpaqueCall(written, read, graph, snapshot);
}
void OpaqueCallEnd(const std::vector<at::Tensor>& outputs) { EndOpaqueCall(outputs); }
void OpaqueCallFailedOp() { OpaqueCallFailed(); }

void LearnStorageSlice(const at::Tensor& slice) { LearnStorageSliceDeleter(slice.storage().data_ptr()); }

c10::DispatchKey HookKey() {
  absl::StatusOr<c10::DispatchKey> key = InstallHook();
  ThrowIfError(key.status());
  return *key;
}

std::string HookKeyName() { return c10::toString(HookKey()); }

// The hook's key as its number: torch's Python enum has no name for it (remat/_higher_order_ops.py).
int64_t HookKeyValue() { return static_cast<int64_t>(HookKey()); }

}  // namespace
}  // namespace remat::integration

TORCH_LIBRARY(remat, m) {
  using namespace remat::integration;
  m.def("enable(int budget) -> ()", &Enable);
  m.def("disable() -> ()", &Disable);
  m.def("is_enabled() -> bool", &IsEnabled);
  m.def("stats() -> Dict(str, int)", &Stats);
  m.def("reset_peak() -> ()", &ResetPeak);
  m.def("track_this_thread(bool enabled) -> ()", &TrackThisThread);
  m.def("parse_budget(str text) -> int", &ParseBudgetBytes);
  m.def("record_start(str path, bool estimated_costs=False) -> ()", &RecordStart);
  m.def("record_stop() -> int", &RecordStop);
  m.def("torch_version() -> str", &TorchVersion);
  m.def("hook_key() -> str", &HookKeyName);
  m.def("hook_key_value() -> int", &HookKeyValue);
  m.def("learn_storage_slice(Tensor slice) -> ()", &LearnStorageSlice);
  m.def("opaque_call_begin(Tensor[] written, Tensor[] read, int graph, Tensor[] snapshot) -> ()", &OpaqueCallBegin);
  m.def("opaque_call_end(Tensor[] outputs) -> ()", &OpaqueCallEnd);
  m.def("opaque_call_failed() -> ()", &OpaqueCallFailedOp);
}
