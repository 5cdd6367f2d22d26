// The torch ops behind remat.enable(policy=...), remat.policies() and the engine's statistics
// (torch.ops.remat.*; a fragment of the library torch_ops.cc defines). Thin wrappers over engine_session.h.
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "integration/engine_session.h"
#include "policies/registry.h"

namespace remat::integration {
namespace {

void ThrowIfError(const absl::Status& status) { TORCH_CHECK(status.ok(), std::string(status.message())); }

void EnableEngine(int64_t budget, const std::string& policy, const std::string& costs) {
  TORCH_CHECK(budget > 0, "remat: budget must be a positive number of bytes, got ", budget);
  ThrowIfError(EnableRematEngine(EngineSessionOptions{static_cast<std::size_t>(budget), policy, costs}));
}

void DisableEngine() { ThrowIfError(DisableRematEngine()); }

bool EngineEnabled() { return RematEngineEnabled(); }

c10::List<std::string> Policies() {
  c10::List<std::string> out;
  for (const std::string& name : PolicyNames()) out.push_back(name);
  return out;
}

c10::Dict<std::string, double> EngineStatsDict() {
  c10::Dict<std::string, double> out;
  absl::StatusOr<BridgeStats> s = GetEngineStats();
  if (!s.ok()) return out;
  auto put = [&](const char* name, auto value) { out.insert(name, static_cast<double>(value)); };
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
  put("relocations", s->relocations);
  put("relocated_bytes", s->relocated_bytes);
  put("shadows", s->executor.shadows);
  put("empty_evictions", s->executor.empty_evictions);
  return out;
}

}  // namespace
}  // namespace remat::integration

TORCH_LIBRARY_FRAGMENT(remat, m) {
  using namespace remat::integration;
  m.def("enable_engine(int budget, str policy, str costs=\"measured\") -> ()", &EnableEngine);
  m.def("disable_engine() -> ()", &DisableEngine);
  m.def("engine_enabled() -> bool", &EngineEnabled);
  m.def("policies() -> str[]", &Policies);
  m.def("engine_stats() -> Dict(str, float)", &EngineStatsDict);
}
