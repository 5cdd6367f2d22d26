// The torch ops behind remat.enable(policy=...), remat.policies() and the engine's statistics
// (torch.ops.remat.*; a fragment of the library torch_ops.cc defines). Thin wrappers over engine_session.h.
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "integration/engine_session.h"
#include "integration/host_tier.h"
#include "integration/session.h"
#include "integration/subclass_arguments.h"
#include "runtime/config.h"
#include "policies/registry.h"

namespace remat::integration {
namespace {

void ThrowIfError(const absl::Status& status) { TORCH_CHECK(status.ok(), std::string(status.message())); }

// offload/host_budget: as ResolvePaging returns them (Python resolves first, to raise ValueError); host_budget < 0
// is unlimited.
// stitch_granule: 0 for the contiguous CPU arena, else the stitching arena's granule (Python resolves `arena`).
void EnableEngine(int64_t budget, const std::string& policy, const std::string& costs, const std::string& offload,
                  int64_t host_budget, const std::string& host_tier, bool page_constants, int64_t stitch_granule) {
  TORCH_CHECK(budget > 0, "remat: budget must be a positive number of bytes, got ", budget);
  EngineSessionOptions options{static_cast<std::size_t>(budget), policy, costs};
  absl::StatusOr<OffloadMode> mode = ParseOffloadMode(offload);
  TORCH_CHECK(mode.ok(), "remat: offload: ", std::string(mode.status().message()));
  options.offload = *mode;
  if (host_budget >= 0) options.host_budget = host_budget;
  absl::StatusOr<HostTierKind> tier = ParseHostTierKind(host_tier);
  TORCH_CHECK(tier.ok(), "remat: host_tier: ", std::string(tier.status().message()));
  options.host_tier = *tier;
  options.page_constants = page_constants;
  TORCH_CHECK(stitch_granule >= 0, "remat: the stitching granule must be >= 0 bytes, got ", stitch_granule);
  options.stitch_granule = static_cast<std::size_t>(stitch_granule);
  ThrowIfError(EnableRematEngine(options));
}

// (offload mode name, host budget bytes or -1 for unlimited) from the options, else the environment.
std::tuple<std::string, int64_t> ResolvePagingOp(const std::optional<std::string>& offload,
                                                 const std::optional<std::string>& host_budget) {
  absl::StatusOr<PagingSetting> paging = ResolvePaging(offload, host_budget);
  ThrowIfError(paging.status());
  const bool unlimited = paging->host_budget == std::numeric_limits<std::int64_t>::max();
  return {std::string(OffloadModeName(paging->offload)), unlimited ? -1 : paging->host_budget};
}

// Validates a host tier name ("memory" or "file").
std::string CheckHostTier(const std::string& text) {
  absl::StatusOr<HostTierKind> tier = ParseHostTierKind(text);
  TORCH_CHECK(tier.ok(), "remat: host_tier: ", std::string(tier.status().message()));
  return std::string(HostTierKindName(*tier));
}

void DisableEngine() { ThrowIfError(DisableRematEngine()); }

int64_t PinState(const std::vector<at::Tensor>& tensors) {
  absl::StatusOr<int> pinned = PinRematState(tensors);
  ThrowIfError(pinned.status());
  return *pinned;
}

bool EngineEnabled() { return RematEngineEnabled(); }

std::vector<int64_t> EngineDevices() {
  std::vector<int64_t> out;
  for (const int device : RematEngineDevices()) out.push_back(device);
  return out;
}

void MakeResidentOp(const at::Tensor& tensor, bool writable) {
  const absl::Status status = MakeResident(tensor, writable);
  if (absl::IsResourceExhausted(status)) TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(status.message()));
  ThrowIfError(status);
}

void StorageWillChangeOp(const c10::Storage& storage) {
  const absl::Status status = StorageWillChange(storage);
  if (absl::IsResourceExhausted(status)) TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(status.message()));
  ThrowIfError(status);
}

// The Python package's callback for ops on tensor subclasses (subclass_arguments.h), as an address (ctypes); 0: none.
void SetSubclassCallback(int64_t address) {
  SetSubclassArgumentCallback(reinterpret_cast<SubclassArgumentCallback>(static_cast<std::uintptr_t>(address)));
}

void HoldInnerReads(const std::vector<at::Tensor>& tensors) { NoteInnerReads(tensors); }

void InnerTensorsWillChange(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& tensor : tensors) {
    if (RealInnerTensor(tensor)) StorageWillChangeOp(tensor.storage());
  }
}

c10::List<std::string> Policies() {
  c10::List<std::string> out;
  for (const std::string& name : PolicyNames()) out.push_back(name);
  return out;
}

// Calls put(name, value) for each statistic of one engine.
template <typename Put>
void PutEngineStats(const BridgeStats* s, Put&& put) {
  put("evictions", s->engine.evictions);
  put("release_evictions", s->engine.release_evictions);
  put("rematerializations", s->engine.rematerializations);
  put("replayed_time_ns", s->engine.remat_compute);  // measured first-run time of the replayed ops
  put("replay_wall_ns", s->executor.replay_ns);      // wall time spent replaying (copies included)
  put("model_time_ns", s->engine.model_compute);
  put("search_ns", s->engine.search_ns);
  put("fragmentation", s->engine.fragmentation_samples > 0
                           ? s->engine.fragmentation_sum / static_cast<double>(s->engine.fragmentation_samples)
                           : 0.0);
  put("pressure_samples", s->engine.fragmentation_samples);
  put("engine_peak_bytes", s->engine.peak_bytes);
  put("tracked_ops", s->ops);
  put("constants", s->constants);
  put("pinned_outputs", s->pinned_outputs);
  put("generations", s->generations);
  put("released", s->released);
  put("kept_constant_bytes", s->kept_constant_bytes);
  put("pruned_records", s->pruned_records);
  put("pruned_entries", s->pruned_entries);
  put("kept_records", s->kept_records);
  put("tracked_storages", s->tracked_storages);
  put("relocations", s->engine.relocations);
  put("relocated_bytes", s->engine.relocated_bytes);
  put("compactions", s->engine.compactions);
  put("compacted_bytes", s->engine.compacted_bytes);
  put("retried_ops", s->retried_ops);
  put("retried_composites", s->retried_composites);
  put("borrowed_room", s->borrowed_room);
  put("retried_replays", s->executor.retried_replays);
  put("deferred_outputs", s->deferred_outputs);
  put("adopted_copies", s->adopted_copies);
  put("constant_copies", s->constant_copies);
  put("unknown_arena_bytes", s->unknown_arena_bytes);
  put("pinned_state", s->pinned_state);
  put("deferred_releases", s->engine.deferred_releases);
  put("late_gathers", s->engine.late_gathers);
  // Paging (zeros with offload off). paged_* and page_* are the engine's counts; stall_ns is its link model's
  // clock time ops waited for page-ins (modelled); page_*_wall_ns the executor's measured copy time.
  put("page_outs", s->engine.page_outs);
  put("page_ins", s->engine.page_ins);
  put("prefetches", s->engine.prefetches);
  put("paged_out_bytes", s->engine.paged_out_bytes);
  put("paged_in_bytes", s->engine.paged_in_bytes);
  put("stall_ns", s->engine.stall_ns);
  put("host_used_bytes", s->engine.host_used_bytes);
  put("host_peak_bytes", s->engine.host_peak_bytes);
  put("resident_and_host_peak_bytes", s->engine.resident_and_host_peak_bytes);
  put("page_out_wall_ns", s->executor.page_out_ns);
  put("page_in_wall_ns", s->executor.page_in_ns);
  put("host_tier_file_bytes", s->host_tier.file_bytes);
  put("shadows", s->executor.shadows);
  put("empty_evictions", s->executor.empty_evictions);
  // Slots of the engine's tables (live or free for reuse): what its host memory grows with.
  put("engine_op_slots", s->engine_tables.op_slots);
  put("engine_tensor_slots", s->engine_tables.tensor_slots);
  put("engine_storage_slots", s->engine_tables.storage_slots);
  put("engine_union_find_nodes", s->engine_tables.union_find_nodes);
  put("engine_op_io_entries", s->engine_tables.op_io_entries);
  // Plan mode (policy "plan"; plan_driver.h); zeros otherwise. plan_status() says which schedule and why it left.
  put("plan_iterations", s->plan.iterations);
  put("plans_made", s->plan.plans_made);
  put("plan_followed_iterations", s->plan.followed_iterations);
  put("plan_departures", s->plan.departures);
  put("plan_failures", s->plan.planning_failures);
  put("plan_following", s->plan.following);
  put("plan_planning", s->plan.planning);
  put("plan_planned_overhead", s->plan.planned_overhead);
  put("plan_victims", s->engine.plan_victims);
  put("plan_fallbacks", s->engine.plan_fallbacks);
}

// With engines on several devices (engine_session.h), each statistic is their sum (peaks too: the most the devices held
// at their own peaks), fragmentation their mean weighted by pressure samples, and "devices" their number; the main
// counts of each also appear as "device<d>_<name>".
c10::Dict<std::string, double> EngineStatsDict() {
  c10::Dict<std::string, double> out;
  const std::vector<DeviceEngineStats> all = GetAllEngineStats();
  if (all.size() == 1) {
    PutEngineStats(&all.front().stats, [&](const char* name, auto value) { out.insert(name, static_cast<double>(value)); });
    return out;
  }
  std::vector<std::pair<std::string, double>> sums;  // in PutEngineStats' order
  double fragmentation_weighted = 0;
  for (const DeviceEngineStats& device : all) {
    std::size_t i = 0;
    PutEngineStats(&device.stats, [&](const char* name, auto value) {
      if (i == sums.size()) sums.emplace_back(name, 0.0);
      sums[i++].second += static_cast<double>(value);
    });
    const EngineStats& e = device.stats.engine;
    fragmentation_weighted += e.fragmentation_sum;
    const std::string prefix = "device" + std::to_string(device.device) + "_";
    out.insert(prefix + "evictions", static_cast<double>(e.evictions));
    out.insert(prefix + "rematerializations", static_cast<double>(e.rematerializations));
    out.insert(prefix + "page_outs", static_cast<double>(e.page_outs));
    out.insert(prefix + "engine_peak_bytes", static_cast<double>(e.peak_bytes));
    out.insert(prefix + "tracked_ops", static_cast<double>(device.stats.ops));
  }
  for (auto& [name, value] : sums) out.insert(name, value);
  const double samples = out.contains("pressure_samples") ? out.at("pressure_samples") : 0.0;
  if (!all.empty()) {
    out.insert_or_assign("fragmentation", samples > 0 ? fragmentation_weighted / samples : 0.0);
    out.insert("devices", static_cast<double>(all.size()));
  }
  return out;
}

void MarkStep() {
  ThrowIfError(TraceWriteStatus());  // a trace losing lines stops the run within a step (session.h)
  MarkRematStep();
}
std::string PlannedTrace() { return RematPlannedTrace(); }

// Plan mode in words: the state, the schedule in force, why the last plan left force or planning failed.
std::string PlanStatus() {
  const std::vector<DeviceEngineStats> all = GetAllEngineStats();  // several devices: the lowest one's
  if (all.empty()) return "remat is not enabled";
  const BridgeStats* s = &all.front().stats;
  const PlanDriverStats& p = s->plan;
  if (p.iterations == 0 && !p.following) return "no iteration ended yet (remat.mark_step(), or an optimizer step)";
  std::string out = p.following ? "following the plan of " + p.source : (p.planning ? "planning" : "online");
  if (!p.last_departure.empty()) out += "; last departure: " + p.last_departure;
  if (!p.last_failure.empty()) out += "; last planning failure: " + p.last_failure;
  return out;
}

}  // namespace
}  // namespace remat::integration

TORCH_LIBRARY_FRAGMENT(remat, m) {
  using namespace remat::integration;
  m.def("enable_engine(int budget, str policy, str costs=\"measured\", str offload=\"off\", int host_budget=-1, "
        "str host_tier=\"memory\", bool page_constants=True, int stitch_granule=0) -> ()",
        &EnableEngine);
  m.def("resolve_paging(str? offload, str? host_budget) -> (str, int)", &ResolvePagingOp);
  m.def("check_host_tier(str host_tier) -> str", &CheckHostTier);
  m.def("disable_engine() -> ()", &DisableEngine);
  m.def("pin_state(Tensor[] tensors) -> int", &PinState);
  m.def("engine_enabled() -> bool", &EngineEnabled);
  m.def("engine_devices() -> int[]", &EngineDevices);
  m.def("make_resident(Tensor tensor, bool writable) -> ()", &MakeResidentOp);
  m.def("storage_will_change(Storage storage) -> ()", &StorageWillChangeOp);
  m.def("policies() -> str[]", &Policies);
  m.def("set_subclass_callback(int address) -> ()", &SetSubclassCallback);
  m.def("hold_inner_reads(Tensor[] tensors) -> ()", &HoldInnerReads);
  m.def("inner_tensors_will_change(Tensor[] tensors) -> ()", &InnerTensorsWillChange);
  m.def("engine_stats() -> Dict(str, float)", &EngineStatsDict);
  m.def("mark_step() -> ()", &MarkStep);
  m.def("plan_status() -> str", &PlanStatus);
  m.def("planned_trace() -> str", &PlannedTrace);
}
