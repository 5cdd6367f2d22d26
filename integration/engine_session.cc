// Engine session: see engine_session.h for the contract.
#include "integration/engine_session.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "integration/cpu_allocator.h"
#include "integration/cpu_device_memory.h"
#include "integration/dispatch_hook.h"
#include "absl/strings/str_cat.h"
#include "integration/session.h"
#include "runtime/byte_size.h"

namespace remat::integration {
namespace {

// Serializes enable and disable (held for the whole of each); g_mutex guards the globals below and is taken only
// briefly, so that MakeResident, PinRematState and GetEngineStats on other threads never wait for a disable.
std::mutex g_lifecycle_mutex;
std::mutex g_mutex;
// A raw pointer on purpose: the bridge is deleted by DisableRematEngine, never by static destruction at exit (ops
// and frees may still reach it while the process tears down with remat enabled).
EngineBridge* g_bridge = nullptr;         // guarded by g_mutex
DeviceMemory* g_memory = nullptr;         // the bridge's memory, owned likewise; guarded by g_mutex
bool g_on_cpu = true;                     // g_memory is the CPU arena's; guarded by g_mutex
std::optional<BridgeStats> g_last_stats;  // guarded by g_mutex

absl::StatusOr<BridgeOptions> ToBridgeOptions(const EngineSessionOptions& options) {
  BridgeOptions bridge_options;
  bridge_options.budget = options.budget;
  bridge_options.policy = options.policy;
  if (options.costs != "measured" && options.costs != "estimated") {
    return absl::InvalidArgumentError("remat: unknown costs '" + options.costs +
                                      "'; expected 'measured' or 'estimated'");
  }
  bridge_options.estimated_costs = options.costs == "estimated";
  bridge_options.paging.mode = options.offload;
  bridge_options.paging.host_budget = options.host_budget;
  bridge_options.paging.page_constants = options.page_constants;
  bridge_options.paging.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  bridge_options.paging.latency_ns = options.latency_ns;
  bridge_options.host_tier = options.host_tier;
  bridge_options.host_tier_directory = options.host_tier_directory;
  // Check the policy and the tier before touching torch's allocator.
  if (absl::StatusOr<std::unique_ptr<EngineBridge>> probe = EngineBridge::Create(bridge_options); !probe.ok()) {
    return probe.status();
  }
  return bridge_options;
}

// Enables the hook (EnableRemat, with the CPU arena or without), then the bridge over `memory`. Holds g_mutex.
absl::Status EnableLocked(const EngineSessionOptions& options, std::unique_ptr<DeviceMemory> memory) {
  if (g_bridge != nullptr) return absl::AlreadyExistsError("remat: already enabled; disable it first");
  absl::StatusOr<BridgeOptions> bridge_options = ToBridgeOptions(options);
  if (!bridge_options.ok()) return bridge_options.status();
  const bool on_cpu = memory == nullptr;
  if (absl::Status status = EnableRemat(RematOptions{options.budget, /*install_cpu_arena=*/on_cpu, options.stitch_granule}); !status.ok()) {
    return status;
  }
  if (on_cpu) memory = std::make_unique<CpuDeviceMemory>(InstalledCpuArena());
  bridge_options->memory = memory.get();
  // Prefetch only where page copies overlap compute (a memory that pages itself on a copy stream: CUDA).
  bridge_options->paging.prefetch = memory->pager() != nullptr;
  bridge_options->next = GetObserver();  // the session's tracker
  absl::StatusOr<std::unique_ptr<EngineBridge>> bridge = EngineBridge::Create(*bridge_options);
  if (!bridge.ok()) {
    (void)DisableRemat();
    return bridge.status();
  }
  g_memory = memory.release();
  g_on_cpu = on_cpu;
  g_bridge = bridge->release();
  g_memory->SetPressureHandler(g_bridge);
  SetObserver(g_bridge);
  SetHeldReferences(g_bridge);
  g_last_stats.reset();
  return absl::OkStatus();
}

// fork(): every lock remat's state depends on is taken before (in an order no thread takes them in reverse) and
// released after, so a child never starts with one held by a thread it does not have. The child keeps the engine
// with no budget: torch's own allocator serves it, and storages evicted at the fork are rematerialized when read.
void PrepareFork() {
  g_lifecycle_mutex.lock();
  g_mutex.lock();
  if (g_bridge != nullptr) g_bridge->LockForFork();  // waits for the op running now
  SessionPrepareFork();
  HookPrepareFork();
  CpuArenaPrepareFork();
}

void ParentAfterFork() {
  CpuArenaParentAfterFork();
  HookParentAfterFork();
  SessionParentAfterFork();
  if (g_bridge != nullptr) g_bridge->UnlockAfterFork();
  g_mutex.unlock();
  g_lifecycle_mutex.unlock();
}

void ChildAfterFork() {
  CpuArenaChildAfterFork();
  HookChildAfterFork();
  SessionChildAfterFork();
  if (g_bridge != nullptr) g_bridge->AfterForkInChild();
  if (g_bridge != nullptr) g_bridge->UnlockAfterFork();
  g_mutex.unlock();
  g_lifecycle_mutex.unlock();
}

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&PrepareFork, &ParentAfterFork, &ChildAfterFork); });
}

}  // namespace

absl::Status EnableRematEngine(const EngineSessionOptions& options) {
  InstallForkHandlers();
  std::lock_guard<std::mutex> lifecycle(g_lifecycle_mutex);
  std::lock_guard<std::mutex> lock(g_mutex);
  return EnableLocked(options, nullptr);
}

absl::Status EnableRematEngineOn(const EngineSessionOptions& options, std::unique_ptr<DeviceMemory> memory) {
  if (memory == nullptr) return absl::InvalidArgumentError("remat: EnableRematEngineOn needs device memory");
  InstallForkHandlers();
  std::lock_guard<std::mutex> lifecycle(g_lifecycle_mutex);
  std::lock_guard<std::mutex> lock(g_mutex);
  return EnableLocked(options, std::move(memory));
}

// From any thread, while other threads may be inside ops, allocating, or calling the API: the bridge stops
// recording only once every storage a user holds is resident (Retire), and is destroyed only once no thread can
// be inside it (no observer call, pressure-handler call or API call in flight).
absl::Status DisableRematEngine() {
  std::lock_guard<std::mutex> lifecycle(g_lifecycle_mutex);
  EngineBridge* bridge = nullptr;
  DeviceMemory* memory = nullptr;
  bool on_cpu = true;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_bridge == nullptr) return absl::FailedPreconditionError("remat: not enabled");
    bridge = g_bridge;
    memory = g_memory;
    on_cpu = g_on_cpu;
  }
  absl::Status status = absl::OkStatus();
  auto keep = [&status](absl::Status s) {
    if (!s.ok() && status.ok()) status = std::move(s);
  };
  c10::DataPtr keep_alive;
  if (on_cpu) {
    // Storages a user still holds get their bytes back once torch's own allocator serves again: together they may
    // exceed the budget. One block of ours keeps the retired arena (which the engine reads for its statistics)
    // alive meanwhile. If even that block does not fit, bring them back under the budget first.
    try {
      keep_alive = RematCpuAllocator()->allocate(kCpuAlignment);
    } catch (const c10::Error&) {
      keep_alive.clear();
    }
    if (!keep_alive) keep(bridge->Retire());
    keep(ReleaseCpuArena());
    if (keep_alive) keep(bridge->Retire());
  } else {
    // The device's memory is all there is: everything comes back under its budget while the bridge can still
    // make room.
    keep(bridge->Retire());
  }
  keep(DisableRemat());  // no observer: ops on every thread pass through from here
  SetHeldReferences(nullptr);
  WaitForObserverCalls();                 // ops that loaded the bridge before have returned
  memory->SetPressureHandler(nullptr);    // and no allocation is inside its MakeRoom
  {
    std::lock_guard<std::mutex> lock(g_mutex);  // nor any API call (they hold g_mutex while they use it)
    g_last_stats = bridge->Stats();
    g_bridge = nullptr;
    g_memory = nullptr;
  }
  delete bridge;
  keep_alive.clear();
  delete memory;
  return status;
}

absl::StatusOr<int> PinRematState(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge == nullptr) return absl::FailedPreconditionError("remat: not enabled");
  int pinned = 0;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.has_storage()) pinned += g_bridge->PinState(t.storage().unsafeGetStorageImpl());
  }
  return pinned;
}

absl::Status MakeResident(const at::Tensor& tensor, bool writable) {
  if (!tensor.defined() || !tensor.has_storage()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge == nullptr) return absl::OkStatus();
  return g_bridge->MakeResident(tensor.storage().unsafeGetStorageImpl(), writable);
}

absl::Status StorageWillChange(const c10::Storage& storage) {
  if (!storage) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge == nullptr) return absl::OkStatus();
  return g_bridge->StorageWillChange(storage.unsafeGetStorageImpl());
}

absl::StatusOr<PagingSetting> ResolvePaging(const std::optional<std::string>& offload,
                                            const std::optional<std::string>& host_budget) {
  // The environment, reduced to the two variables this resolves (a malformed REMAT_BUDGET is not our business).
  absl::StatusOr<Settings> environment = SettingsFromEnvironment([](const char* name) -> const char* {
    const std::string_view n(name);
    return n == "REMAT_OFFLOAD" || n == "REMAT_HOST_BUDGET" ? std::getenv(name) : nullptr;
  });
  if (!environment.ok()) return absl::InvalidArgumentError(absl::StrCat("remat: ", environment.status().message()));
  PagingSetting out;
  if (offload.has_value() && !offload->empty()) {
    absl::StatusOr<OffloadMode> mode = ParseOffloadMode(*offload);
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("remat: offload: ", mode.status().message()));
    out.offload = *mode;
  } else if (environment->offload.has_value()) {
    out.offload = *environment->offload;
  }
  std::optional<std::uint64_t> bytes = environment->host_budget;
  if (host_budget.has_value() && !host_budget->empty()) {
    absl::StatusOr<std::uint64_t> parsed = ParseByteSize(*host_budget);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("remat: host_budget: ", parsed.status().message()));
    }
    bytes = *parsed;
  }
  if (bytes.has_value()) {
    if (*bytes == 0 || *bytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      const bool given = host_budget.has_value() && !host_budget->empty();
      return absl::InvalidArgumentError(absl::StrCat("remat: ", given ? "host_budget" : "REMAT_HOST_BUDGET",
                                                     ": the host budget must be > 0 bytes, got ", *bytes));
    }
    out.host_budget = static_cast<std::int64_t>(*bytes);
  }
  return out;
}

bool RematEngineEnabled() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_bridge != nullptr;
}

void MarkRematStep() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bridge != nullptr) g_bridge->MarkStep();
}

std::string RematPlannedTrace() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_bridge != nullptr ? g_bridge->PlannedTrace() : std::string();
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
