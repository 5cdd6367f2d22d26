// Session: see session.h for the contract.
#include "integration/session.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "integration/dispatch_hook.h"
#include "integration/pin_listener.h"
#include "integration/trace_recorder.h"

namespace remat::integration {
namespace {

// The observer until the runtime exists: counts what it sees, hands it to the trace recorder if one is open,
// and drops the records.
class TrackingObserver final : public OpObserver, public PinListener {
 public:
  void BeforeOp(OpRecord&) override {}
  void AfterOp(OpRecord&& record) override { AfterOpLent(record); }
  void AfterOpLent(const OpRecord& record) override {
    ops_.fetch_add(1, std::memory_order_relaxed);
    if (record.traits->random) random_ops_.fetch_add(1, std::memory_order_relaxed);
    time_ns_.fetch_add(record.duration_ns, std::memory_order_relaxed);
    if (recording_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(recorder_mutex_);
      if (recorder_ != nullptr) recorder_->OnOp(record);
    }
  }
  void OpFailed(OpRecord&) noexcept override {}
  void Pinned(const c10::StorageImpl* storage) override {
    std::lock_guard<std::mutex> lock(recorder_mutex_);
    if (recorder_ != nullptr) recorder_->OnPinned(storage);
  }
  void BlankOverwritten(const c10::StorageImpl* storage) override {
    std::lock_guard<std::mutex> lock(recorder_mutex_);
    if (recorder_ != nullptr) recorder_->OnBlankOverwritten(storage);
  }

  bool Recording() { return recording_.load(std::memory_order_acquire); }
  void SetRecorder(std::unique_ptr<TraceRecorder> recorder) {
    std::lock_guard<std::mutex> lock(recorder_mutex_);
    recorder_ = std::move(recorder);
    recording_.store(recorder_ != nullptr, std::memory_order_release);
    SetPinListener(recorder_ != nullptr ? this : nullptr);
  }
  absl::Status WriteStatus() {
    if (!recording_.load(std::memory_order_acquire)) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(recorder_mutex_);
    return recorder_ != nullptr ? recorder_->WriteStatus() : absl::OkStatus();
  }
  std::unique_ptr<TraceRecorder> TakeRecorder() {
    std::lock_guard<std::mutex> lock(recorder_mutex_);
    recording_.store(false, std::memory_order_release);
    SetPinListener(nullptr);
    return std::move(recorder_);
  }

  // fork(): the recorder's lock is held across it; the child drops the parent's recorder without writing to its file.
  void LockForFork() { recorder_mutex_.lock(); }
  void UnlockAfterFork() { recorder_mutex_.unlock(); }
  void DropRecorderInChild() {
    recording_.store(false, std::memory_order_release);
    SetPinListener(nullptr);
    (void)recorder_.release();  // leaked: closing it would write the parent's trace
    recorder_mutex_.unlock();
  }

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
  std::atomic<bool> recording_{false};
  std::mutex recorder_mutex_;
  std::unique_ptr<TraceRecorder> recorder_;  // guarded by recorder_mutex_
};

std::mutex g_mutex;
bool g_enabled = false;  // guarded by g_mutex
bool g_cpu_arena = false;  // this session installed the CPU arena; guarded by g_mutex

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
  if (options.install_cpu_arena) {
    if (absl::Status status = InstallCpuArena(options.budget, options.stitch_granule); !status.ok()) return status;
  }
  Tracker().Reset();
  SetObserver(&Tracker());
  if (absl::Status status = SetHookEnabledOnThisThread(true); !status.ok()) {
    SetObserver(nullptr);
    if (options.install_cpu_arena) (void)UninstallCpuArena();
    return status;
  }
  g_cpu_arena = options.install_cpu_arena;
  g_enabled = true;
  return absl::OkStatus();
}

absl::Status DisableRemat() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_enabled) return absl::FailedPreconditionError("remat: not enabled");
  absl::Status status = SetHookEnabledOnThisThread(false);
  SetObserver(nullptr);
  if (std::unique_ptr<TraceRecorder> recorder = Tracker().TakeRecorder(); recorder != nullptr) {
    if (absl::Status closed = recorder->Close(); !closed.ok() && status.ok()) status = closed;
  }
  if (g_cpu_arena) {
    if (absl::Status uninstall = UninstallCpuArena(); !uninstall.ok() && status.ok()) status = uninstall;
    g_cpu_arena = false;
  }
  g_enabled = false;
  return status;
}

absl::Status ReleaseCpuArena() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_enabled || !g_cpu_arena) return absl::OkStatus();
  g_cpu_arena = false;
  return UninstallCpuArena();
}

void SessionPrepareFork() {
  g_mutex.lock();
  Tracker().LockForFork();
}

void SessionParentAfterFork() {
  Tracker().UnlockAfterFork();
  g_mutex.unlock();
}

void SessionChildAfterFork() {
  Tracker().DropRecorderInChild();
  g_mutex.unlock();
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
  stats.has_arena = arena.ok() && !(g_enabled && !g_cpu_arena);
  if (arena.ok()) stats.arena = *arena;
  stats.ops_recorded = Tracker().ops();
  stats.random_ops_recorded = Tracker().random_ops();
  stats.op_time_ns = Tracker().time_ns();
  return stats;
}

absl::Status StartTrace(const std::string& path, bool estimated_costs,
                        const std::vector<c10::intrusive_ptr<c10::StorageImpl>>& declared,
                        TraceRecorder::CountsAgainstBudget counts) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_enabled) return absl::FailedPreconditionError("remat: enable remat before recording a trace");
  if (Tracker().Recording()) return absl::FailedPreconditionError("remat: a trace is already being recorded");
  absl::StatusOr<std::unique_ptr<TraceRecorder>> recorder = TraceRecorder::Open(path, estimated_costs, std::move(counts));
  if (!recorder.ok()) return recorder.status();
  for (const auto& storage : declared) (*recorder)->Declare(*storage);
  Tracker().SetRecorder(std::move(*recorder));
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> StopTrace() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::unique_ptr<TraceRecorder> recorder = Tracker().TakeRecorder();
  if (recorder == nullptr) return absl::FailedPreconditionError("remat: no trace is being recorded");
  if (absl::Status closed = recorder->Close(); !closed.ok()) return closed;
  return recorder->ops_written();
}

absl::Status TraceWriteStatus() { return Tracker().WriteStatus(); }

RematGuard::RematGuard(const RematOptions& options) {
  const absl::Status status = EnableRemat(options);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

RematGuard::~RematGuard() { (void)DisableRemat(); }

}  // namespace remat::integration
