// Engine session: see engine_session.h for the contract.
#include "integration/engine_session.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "integration/cpu_allocator.h"
#include "integration/cpu_device_memory.h"
#include "integration/device_router.h"
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
// The engines, one per device in ascending device order (the CPU session: one, over the CPU arena). Raw pointers on
// purpose: bridges, routers and memories are deleted by DisableRematEngine, never by static destruction at exit (ops
// and frees may still reach them while the process tears down with remat enabled). All guarded by g_mutex.
std::vector<DeviceEngine> g_engines;
// Every router made since the first enable (the observer with more than one engine; device_router.h): an op that
// loaded an older one may still be inside it, so they all live until disable.
std::vector<DeviceRouter*> g_routers;
// API calls in flight on a bridge (ApiCall). They find their bridges under g_mutex but call them after releasing it:
// a bridge's lock may be held by an op in flight whose kernel itself calls the API (a Python dispatch mode's handler
// reading a storage, which needs g_mutex to find the bridge), so waiting for that lock while holding g_mutex
// deadlocked. DisableRematEngine deletes bridges only once no API call is in flight.
std::atomic<int> g_api_calls{0};
OpObserver* g_tracker = nullptr;  // the session's tracker, every bridge's `next`
bool g_on_cpu = true;             // g_engines is the CPU arena's one
std::vector<DeviceEngineStats> g_last_stats;

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

// The observer and held-reference counter for the engines now: the bridge itself when there is one, else a new
// router over them all. Holds g_mutex.
void InstallObserverLocked() {
  if (g_engines.size() == 1) {
    SetObserver(g_engines.front().bridge);
    SetHeldReferences(g_engines.front().bridge);
    return;
  }
  auto* router = new DeviceRouter(g_engines, g_tracker);
  g_routers.push_back(router);
  SetObserver(router);
  SetHeldReferences(router);
}

// Counts an API call in flight on the bridges it found; made while g_mutex is held (so that a disable that has
// cleared g_engines under g_mutex sees every call that found a bridge), destroyed after the call.
class ApiCall {
 public:
  ApiCall() { g_api_calls.fetch_add(1, std::memory_order_seq_cst); }
  ~ApiCall() { g_api_calls.fetch_sub(1, std::memory_order_release); }
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;
};

void WaitForApiCalls() {
  while (g_api_calls.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

// Every engine, with an ApiCall that keeps their bridges alive after g_mutex is released (empty: not enabled).
struct Engines {
  std::vector<DeviceEngine> engines;
  std::optional<ApiCall> call;
};

void FindAllEngines(Engines& out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  out.engines = g_engines;
  if (!out.engines.empty()) out.call.emplace();
}

// The bridge that tracks `storage`: the one engine's, else the engine of its device (nullptr: none). Holds g_mutex.
EngineBridge* BridgeOfLocked(c10::StorageImpl& storage) {
  if (g_engines.empty()) return nullptr;
  if (g_engines.size() == 1) return g_engines.front().bridge;
  const int e = g_routers.back()->EngineOf(storage);
  return e < 0 ? nullptr : g_engines[static_cast<std::size_t>(e)].bridge;
}

// BridgeOfLocked under g_mutex, with `call` counting this API call on the bridge found (none when nullptr).
EngineBridge* FindBridge(c10::StorageImpl& storage, std::optional<ApiCall>& call) {
  std::lock_guard<std::mutex> lock(g_mutex);
  EngineBridge* bridge = BridgeOfLocked(storage);
  if (bridge != nullptr) call.emplace();
  return bridge;
}

// The first engine enables the hook (EnableRemat, with the CPU arena or without); later ones (other devices) add a
// bridge over their memory and switch the hook on for the calling thread. Holds g_mutex.
absl::Status EnableLocked(const EngineSessionOptions& options, std::unique_ptr<DeviceMemory> memory) {
  const bool on_cpu = memory == nullptr;
  const int device = on_cpu ? -1 : memory->history_device();
  if (!g_engines.empty()) {
    if (on_cpu || g_on_cpu) return absl::AlreadyExistsError("remat: already enabled; disable it first");
    for (const DeviceEngine& engine : g_engines) {
      if (engine.device == device) {
        return absl::AlreadyExistsError(
            absl::StrCat("remat: the engine already runs on device ", device, "; disable it first"));
      }
    }
  }
  absl::StatusOr<BridgeOptions> bridge_options = ToBridgeOptions(options);
  if (!bridge_options.ok()) return bridge_options.status();
  const bool first = g_engines.empty();
  if (first) {
    if (absl::Status status = EnableRemat(RematOptions{options.budget, /*install_cpu_arena=*/on_cpu, options.stitch_granule}); !status.ok()) {
      return status;
    }
    g_tracker = GetObserver();
  } else if (absl::Status status = SetHookEnabledOnThisThread(true); !status.ok()) {
    return status;
  }
  if (on_cpu) memory = std::make_unique<CpuDeviceMemory>(InstalledCpuArena());
  bridge_options->memory = memory.get();
  // Prefetch only where page copies overlap compute (a memory that pages itself on a copy stream: CUDA).
  bridge_options->paging.prefetch = memory->pager() != nullptr;
  bridge_options->next = g_tracker;
  absl::StatusOr<std::unique_ptr<EngineBridge>> bridge = EngineBridge::Create(*bridge_options);
  if (!bridge.ok()) {
    if (first) (void)DisableRemat();
    return bridge.status();
  }
  const DeviceEngine engine{device, bridge->release(), memory.release()};
  engine.memory->SetPressureHandler(engine.bridge);
  g_engines.insert(std::upper_bound(g_engines.begin(), g_engines.end(), engine,
                                    [](const DeviceEngine& a, const DeviceEngine& b) { return a.device < b.device; }),
                   engine);
  g_on_cpu = on_cpu;
  InstallObserverLocked();
  if (first) g_last_stats.clear();
  return absl::OkStatus();
}

// fork(): every lock remat's state depends on is taken before (in an order no thread takes them in reverse: the
// engines' in ascending device order, as the router does, then g_mutex, which an op's kernel may ask for while its
// thread holds its engine's lock) and released after, so a child never starts with one held by a thread it does
// not have. The child keeps the engines with no budget: torch's own allocator serves it (on the CPU), and storages
// evicted at the fork are rematerialized when read. g_lifecycle_mutex keeps g_engines as it is meanwhile.
void PrepareFork() {
  g_lifecycle_mutex.lock();
  std::vector<EngineBridge*> bridges;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const DeviceEngine& engine : g_engines) bridges.push_back(engine.bridge);
  }
  for (EngineBridge* bridge : bridges) bridge->LockForFork();  // each waits for its op running now
  g_mutex.lock();
  SessionPrepareFork();
  HookPrepareFork();
  CpuArenaPrepareFork();
}

void ParentAfterFork() {
  CpuArenaParentAfterFork();
  HookParentAfterFork();
  SessionParentAfterFork();
  for (auto it = g_engines.rbegin(); it != g_engines.rend(); ++it) it->bridge->UnlockAfterFork();
  g_mutex.unlock();
  g_lifecycle_mutex.unlock();
}

void ChildAfterFork() {
  CpuArenaChildAfterFork();
  HookChildAfterFork();
  SessionChildAfterFork();
  for (const DeviceEngine& engine : g_engines) engine.bridge->AfterForkInChild();
  for (auto it = g_engines.rbegin(); it != g_engines.rend(); ++it) it->bridge->UnlockAfterFork();
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

// From any thread, while other threads may be inside ops, allocating, or calling the API: each bridge stops
// recording only once every storage a user holds on its device is resident (Retire), and they are destroyed only once
// no thread can be inside them (no observer call, pressure-handler call or API call in flight).
absl::Status DisableRematEngine() {
  std::lock_guard<std::mutex> lifecycle(g_lifecycle_mutex);
  std::vector<DeviceEngine> engines;
  bool on_cpu = true;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_engines.empty()) return absl::FailedPreconditionError("remat: not enabled");
    engines = g_engines;
    on_cpu = g_on_cpu;
  }
  absl::Status status = absl::OkStatus();
  auto keep = [&status](absl::Status s) {
    if (!s.ok() && status.ok()) status = std::move(s);
  };
  std::shared_ptr<void> arena_alive;
  if (on_cpu) {
    EngineBridge* bridge = engines.front().bridge;
    // Storages a user still holds get their bytes back once torch's own allocator serves again: together they may
    // exceed the budget (after an out-of-memory error, they did), and none may stay evicted once the engine is gone.
    // A reference to the arena (not a block of it: a full arena has none to give) keeps the retired arena, which the
    // engine reads for its statistics, alive meanwhile.
    arena_alive = RetainCpuArena();
    keep(ReleaseCpuArena());
    keep(bridge->Retire());
  } else {
    // Each device's memory is all there is: everything comes back under its budget while its bridge can still make
    // room, its replays run with its device current (as the router runs them).
    for (const DeviceEngine& engine : engines) {
      const int previous = engine.memory->CurrentDevice();
      if (previous != engine.device) keep(engine.memory->SetCurrentDevice(engine.device));
      keep(engine.bridge->Retire());
      if (previous >= 0 && previous != engine.device) keep(engine.memory->SetCurrentDevice(previous));
    }
  }
  keep(DisableRemat());  // no observer: ops on every thread pass through from here
  SetHeldReferences(nullptr);
  WaitForObserverCalls();  // ops that loaded a bridge or router before have returned
  for (const DeviceEngine& engine : engines) engine.memory->SetPressureHandler(nullptr);  // none inside MakeRoom
  std::vector<DeviceRouter*> routers;
  {
    std::lock_guard<std::mutex> lock(g_mutex);  // no API call finds them from here (WaitForApiCalls below)
    g_last_stats.clear();
    for (const DeviceEngine& engine : engines) g_last_stats.push_back({engine.device, engine.bridge->Stats()});
    g_engines.clear();
    routers.swap(g_routers);
    g_tracker = nullptr;
  }
  WaitForApiCalls();  // calls that found a bridge before it left g_engines have returned
  for (DeviceRouter* router : routers) delete router;
  for (const DeviceEngine& engine : engines) delete engine.bridge;
  arena_alive.reset();
  for (const DeviceEngine& engine : engines) delete engine.memory;
  return status;
}

absl::StatusOr<int> PinRematState(const std::vector<at::Tensor>& tensors) {
  std::vector<std::pair<EngineBridge*, c10::StorageImpl*>> targets;
  std::optional<ApiCall> call;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_engines.empty()) return absl::FailedPreconditionError("remat: not enabled");
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || !t.has_storage()) continue;
      c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
      if (EngineBridge* bridge = BridgeOfLocked(*impl)) targets.emplace_back(bridge, impl);
    }
    call.emplace();
  }
  int pinned = 0;
  for (const auto& [bridge, impl] : targets) pinned += bridge->PinState(impl);
  return pinned;
}

absl::Status MakeResident(const at::Tensor& tensor, bool writable) {
  if (!tensor.defined() || !tensor.has_storage()) return absl::OkStatus();
  c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
  std::optional<ApiCall> call;
  EngineBridge* bridge = FindBridge(*impl, call);
  return bridge == nullptr ? absl::OkStatus() : bridge->MakeResident(impl, writable);
}

absl::Status StorageWillChange(const c10::Storage& storage) {
  if (!storage) return absl::OkStatus();
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  std::optional<ApiCall> call;
  EngineBridge* bridge = FindBridge(*impl, call);
  return bridge == nullptr ? absl::OkStatus() : bridge->StorageWillChange(impl);
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
  return !g_engines.empty();
}

std::vector<int> RematEngineDevices() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<int> devices;
  for (const DeviceEngine& engine : g_engines) devices.push_back(engine.device);
  return devices;
}

void MarkRematStep() {
  Engines all;
  FindAllEngines(all);
  for (const DeviceEngine& engine : all.engines) engine.bridge->MarkStep();
}

std::vector<c10::intrusive_ptr<c10::StorageImpl>> RematHeldStorages() {
  Engines all;
  FindAllEngines(all);
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> held;
  for (const DeviceEngine& engine : all.engines) {
    for (auto& storage : engine.bridge->HeldStorages()) held.push_back(std::move(storage));
  }
  return held;
}

TraceRecorder::CountsAgainstBudget RematBudgetedMemory() {
  std::vector<const DeviceMemory*> memories;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const DeviceEngine& engine : g_engines) memories.push_back(engine.memory);
  }
  if (memories.empty()) return nullptr;
  return [memories = std::move(memories)](c10::StorageImpl& storage) {
    for (const DeviceMemory* memory : memories) {
      if (EvictableMemory(*memory, storage)) return true;
    }
    return false;
  };
}

std::string RematPlannedTrace() {
  Engines all;
  FindAllEngines(all);
  return all.engines.empty() ? std::string() : all.engines.front().bridge->PlannedTrace();
}

std::vector<DeviceEngineStats> GetAllEngineStats() {
  Engines all;
  FindAllEngines(all);
  if (all.engines.empty()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_last_stats;
  }
  std::vector<DeviceEngineStats> out;
  for (const DeviceEngine& engine : all.engines) out.push_back({engine.device, engine.bridge->Stats()});
  return out;
}

absl::StatusOr<BridgeStats> GetEngineStats() {
  std::vector<DeviceEngineStats> all = GetAllEngineStats();
  if (all.empty()) return absl::NotFoundError("remat: the engine has not been enabled");
  if (all.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat("remat: engines run on ", all.size(),
                                                      " devices: ask for one device's statistics"));
  }
  return std::move(all.front().stats);
}

absl::StatusOr<BridgeStats> GetEngineStats(int device) {
  for (DeviceEngineStats& stats : GetAllEngineStats()) {
    if (stats.device == device) return std::move(stats.stats);
  }
  return absl::NotFoundError(absl::StrCat("remat: no engine has run on device ", device));
}

EngineGuard::EngineGuard(const EngineSessionOptions& options) {
  const absl::Status status = EnableRematEngine(options);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

EngineGuard::~EngineGuard() { (void)DisableRematEngine(); }

}  // namespace remat::integration
