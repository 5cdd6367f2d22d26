// Session: see session.h for the contract.
#include "integration/session.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <string>

#include "integration/dispatch_hook.h"

namespace remat::integration {
namespace {

// The observer until the runtime exists: counts what it sees and drops the records.
class TrackingObserver final : public OpObserver {
 public:
  void BeforeOp(OpRecord&) override {}
  void AfterOp(OpRecord&& record) override {
    ops_.fetch_add(1, std::memory_order_relaxed);
    if (record.traits->random) random_ops_.fetch_add(1, std::memory_order_relaxed);
    time_ns_.fetch_add(record.duration_ns, std::memory_order_relaxed);
  }
  void OpFailed(OpRecord&) noexcept override {}

  void Reset() {
    ops_ = 0;
    random_ops_ = 0;
    time_ns_ = 0;
  }
  std::uint64_t ops() const { return ops_.load(std::memory_order_relaxed); }
  std::uint64_t random_ops() const { return random_ops_.load(std::memory_order_relaxed); }
  std::uint64_t time_ns() const { return time_ns_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> ops_{0};
  std::atomic<std::uint64_t> random_ops_{0};
  std::atomic<std::uint64_t> time_ns_{0};
};

std::mutex g_mutex;
bool g_enabled = false;  // guarded by g_mutex

TrackingObserver& Tracker() {
  static auto* tracker = new TrackingObserver();  // never destroyed: an op in flight may still hold it
  return *tracker;
}

}  // namespace

absl::Status EnableRemat(const RematOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_enabled) return absl::AlreadyExistsError("remat: already enabled; disable it first");
  absl::StatusOr<c10::DispatchKey> key = InstallHook();
  if (!key.ok()) return key.status();
  if (absl::Status status = InstallCpuArena(options.budget); !status.ok()) return status;
  Tracker().Reset();
  SetObserver(&Tracker());
  if (absl::Status status = SetHookEnabledOnThisThread(true); !status.ok()) {
    SetObserver(nullptr);
    (void)UninstallCpuArena();
    return status;
  }
  g_enabled = true;
  return absl::OkStatus();
}

absl::Status DisableRemat() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_enabled) return absl::FailedPreconditionError("remat: not enabled");
  absl::Status status = SetHookEnabledOnThisThread(false);
  SetObserver(nullptr);
  if (absl::Status uninstall = UninstallCpuArena(); !uninstall.ok() && status.ok()) status = uninstall;
  g_enabled = false;
  return status;
}

bool RematEnabled() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_enabled;
}

RematStats GetRematStats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  RematStats stats;
  stats.enabled = g_enabled;
  absl::StatusOr<CpuArenaStats> arena = GetCpuArenaStats();
  stats.has_arena = arena.ok();
  if (arena.ok()) stats.arena = *arena;
  stats.ops_recorded = Tracker().ops();
  stats.random_ops_recorded = Tracker().random_ops();
  stats.op_time_ns = Tracker().time_ns();
  return stats;
}

RematGuard::RematGuard(const RematOptions& options) {
  const absl::Status status = EnableRemat(options);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

RematGuard::~RematGuard() { (void)DisableRemat(); }

}  // namespace remat::integration
