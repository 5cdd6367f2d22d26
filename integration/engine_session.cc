// Engine session: see engine_session.h for the contract.
#include "integration/engine_session.h"

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "integration/cpu_allocator.h"
#include "integration/dispatch_hook.h"
#include "integration/session.h"

namespace remat::integration {
namespace {

std::mutex g_mutex;
// A raw pointer on purpose: the bridge is deleted by DisableRematEngine, never by static destruction at exit (ops
// and frees may still reach it while the process tears down with remat enabled).
EngineBridge* g_bridge = nullptr;         // guarded by g_mutex
std::optional<BridgeStats> g_last_stats;  // guarded by g_mutex

}  // namespace

absl::Status EnableRematEngine(const EngineSessionOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge != nullptr) return absl::AlreadyExistsError("remat: already enabled; disable it first");
  BridgeOptions bridge_options;
  bridge_options.budget = options.budget;
  bridge_options.policy = options.policy;
  if (options.costs != "measured" && options.costs != "estimated") {
    return absl::InvalidArgumentError("remat: unknown costs '" + options.costs +
                                      "'; expected 'measured' or 'estimated'");
  }
  bridge_options.estimated_costs = options.costs == "estimated";
  // Check the policy before touching torch's allocator.
  if (absl::StatusOr<std::unique_ptr<EngineBridge>> probe = EngineBridge::Create(bridge_options); !probe.ok()) {
    return probe.status();
  }
  if (absl::Status status = EnableRemat(RematOptions{options.budget}); !status.ok()) return status;
  bridge_options.arena = InstalledCpuArena();
  bridge_options.next = GetObserver();  // the session's tracker
  absl::StatusOr<std::unique_ptr<EngineBridge>> bridge = EngineBridge::Create(bridge_options);
  if (!bridge.ok()) {
    (void)DisableRemat();
    return bridge.status();
  }
  g_bridge = bridge->release();
  SetCpuPressureHandler(g_bridge);
  SetObserver(g_bridge);
  g_last_stats.reset();
  return absl::OkStatus();
}

absl::Status DisableRematEngine() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge == nullptr) return absl::FailedPreconditionError("remat: not enabled");
  SetObserver(nullptr);
  // Storages a user still holds get their bytes back after the arena is uninstalled, from torch's own allocator:
  // together they may exceed the budget. One block of ours keeps the retired arena (which the engine reads for
  // its statistics) alive meanwhile. If even that block does not fit, bring them back under the budget first.
  c10::DataPtr keep_alive;
  try {
    keep_alive = RematCpuAllocator()->allocate(kCpuAlignment);
  } catch (const c10::Error&) {
    keep_alive.clear();
  }
  absl::Status status = absl::OkStatus();
  if (!keep_alive) status = g_bridge->MaterializeLive();
  SetCpuPressureHandler(nullptr);
  if (absl::Status disabled = DisableRemat(); !disabled.ok() && status.ok()) status = disabled;
  if (keep_alive) status = g_bridge->MaterializeLive();
  g_last_stats = g_bridge->Stats();
  delete g_bridge;
  g_bridge = nullptr;
  keep_alive.clear();
  return status;
}

bool RematEngineEnabled() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_bridge != nullptr;
}

absl::StatusOr<BridgeStats> GetEngineStats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge != nullptr) return g_bridge->Stats();
  if (g_last_stats.has_value()) return *g_last_stats;
  return absl::NotFoundError("remat: the engine has not been enabled");
}

EngineGuard::EngineGuard(const EngineSessionOptions& options) {
  const absl::Status status = EnableRematEngine(options);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

EngineGuard::~EngineGuard() { (void)DisableRematEngine(); }

}  // namespace remat::integration
