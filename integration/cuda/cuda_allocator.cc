// RematCudaAllocator: see cuda_allocator.h for the contract. This file translates between c10's allocator
// interface (exceptions, DataPtr, DeviceStats) and DeviceArena (Status, addresses, StatCounter); the memory and
// stream logic lives in allocator/cuda/.
//
// Deleter. c10 frees through a plain function pointer that only gets the data pointer. Live allocators sit in a
// small registry (normally one: the installed allocator, which is never destroyed; tests make more); the deleter
// asks each whether it owns the pointer (one hash probe per device arena).
#include "integration/cuda/cuda_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>
#include <shared_mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "integration/cuda/cuda_history.h"
#include "integration/cuda/cuda_snapshot.h"
#include "integration/memory_events.h"

namespace remat::integration {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

std::shared_mutex g_registry_mutex;
std::vector<RematCudaAllocator*> g_registry;  // guarded by g_registry_mutex
thread_local Placement t_placement = Placement::kLow;

[[noreturn]] void Unsupported(std::string_view what) {
  TORCH_CHECK(false, "remat does not support ", std::string(what),
              " (remat's CUDA allocator keeps one budget-sized arena per device; use PyTorch's own allocator for "
              "this feature)");
}

void RawDelete(void* ptr) {
  if (ptr == nullptr) return;
  RematCudaAllocator* owner = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
    for (RematCudaAllocator* allocator : g_registry) {
      if (allocator->Owns(ptr)) {
        owner = allocator;
        break;
      }
    }
  }
  if (owner == nullptr) {
    TORCH_WARN("remat: freeing CUDA pointer ", ptr, " that no remat allocator owns; ignored");
    return;
  }
  owner->Free(ptr);
}

void CopyStat(const cuda::StatCounter& from, c10::CachingAllocator::StatArray& to) {
  for (auto type : {c10::CachingAllocator::StatType::AGGREGATE, c10::CachingAllocator::StatType::LARGE_POOL}) {
    auto& stat = to[static_cast<std::size_t>(type)];
    stat.current = from.current;
    stat.peak = from.peak;
    stat.allocated = from.allocated;
    stat.freed = from.freed;
  }
}

}  // namespace

RematCudaAllocator::RematCudaAllocator(cuda::CudaRuntime* runtime, CudaAllocatorOptions options, CudaStreams streams)
    : runtime_(runtime), options_(options), streams_(std::move(streams)) {
  TORCH_CHECK(runtime_ != nullptr, "remat: the CUDA allocator needs a CUDA runtime");
  TORCH_CHECK(streams_.current != nullptr && streams_.handle != nullptr,
              "remat: the CUDA allocator needs the current-stream and stream-handle functions");
  TORCH_CHECK(options_.budget > 0 || (options_.budget_fraction > 0 && options_.budget_fraction <= 1),
              "remat: the CUDA budget must be > 0 bytes or a fraction of device memory in (0, 1], got ",
              options_.budget, " bytes / fraction ", options_.budget_fraction);
  std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
  g_registry.push_back(this);
}

RematCudaAllocator::~RematCudaAllocator() {
  {
    std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
    g_registry.erase(std::remove(g_registry.begin(), g_registry.end(), this), g_registry.end());
  }
  for (PagingState& paging : paging_) {
    paging.pager.reset();
    paging.pool.reset();
  }
}

int RematCudaAllocator::DeviceCountLocked() {
  if (device_count_ < 0) {
    absl::StatusOr<int> count = runtime_->DeviceCount();
    TORCH_CHECK(count.ok(), "remat: cannot count CUDA devices: ", std::string(count.status().message()));
    device_count_ = std::min(*count, kMaxDevices);
  }
  return device_count_;
}

cuda::DeviceArena& RematCudaAllocator::Device(c10::DeviceIndex device) {
  if (device >= 0 && device < kMaxDevices) {
    if (cuda::DeviceArena* arena = devices_[static_cast<std::size_t>(device)].load(std::memory_order_acquire)) {
      return *arena;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int count = DeviceCountLocked();
  TORCH_CHECK(device >= 0 && device < count, "remat: invalid CUDA device ", static_cast<int>(device), " (", count,
              " device(s))");
  auto& slot = devices_[static_cast<std::size_t>(device)];
  if (cuda::DeviceArena* arena = slot.load(std::memory_order_acquire)) return *arena;
  cuda::DeviceArenaOptions arena_options;
  arena_options.device = device;
  arena_options.budget = options_.budget;
  arena_options.budget_fraction = options_.budget_fraction;
  arena_options.kind = options_.arena;
  arena_options.granule = options_.stitch_granule;
  absl::StatusOr<std::unique_ptr<cuda::DeviceArena>> arena = cuda::DeviceArena::Create(runtime_, arena_options);
  TORCH_CHECK(arena.ok(), std::string(arena.status().message()));
  owned_devices_.push_back(std::move(*arena));
  slot.store(owned_devices_.back().get(), std::memory_order_release);
  return *owned_devices_.back();
}

cuda::DeviceArena* RematCudaAllocator::FindOwner(const void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  for (const auto& slot : devices_) {
    cuda::DeviceArena* arena = slot.load(std::memory_order_acquire);
    if (arena != nullptr && arena->Owns(address)) return arena;
  }
  return nullptr;
}

bool RematCudaAllocator::Owns(const void* ptr) const { return FindOwner(ptr) != nullptr; }

void RematCudaAllocator::ThrowOutOfMemory(c10::DeviceIndex device, std::size_t bytes, const absl::Status& status) {
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    observers = oom_observers_;
  }
  if (MemoryHistoryEnabled()) {
    const cuda::DeviceArenaStats stats = Device(device).Stats();
    const std::size_t allocated = static_cast<std::size_t>(stats.allocated_bytes.current);
    RecordMemoryEvent(MemoryEventKind::kOutOfMemory, 0, bytes, stats.budget > allocated ? stats.budget - allocated : 0,
                      device);
  }
  if (!observers.empty()) {
    const cuda::DeviceArenaStats stats = Device(device).Stats();
    const std::size_t allocated = static_cast<std::size_t>(stats.allocated_bytes.current);
    for (const auto& observer : observers) {
      observer(device, allocated, stats.budget, stats.budget > allocated ? stats.budget - allocated : 0);
    }
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(status.message()));
}

void* RematCudaAllocator::Malloc(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream) {
  cuda::DeviceArena& arena = Device(device);
  absl::StatusOr<std::uintptr_t> address = arena.Allocate(bytes, stream, t_placement);
  if (!address.ok()) {
    if (address.status().code() == absl::StatusCode::kResourceExhausted) {
      ThrowOutOfMemory(device, bytes, address.status());
    }
    TORCH_CHECK(false, std::string(address.status().message()));
  }
  if (MemoryHistoryEnabled()) {
    RecordMemoryEvent(MemoryEventKind::kAlloc, *address, arena.BlockSize(*address).value_or(bytes), 0, device);
  }
  return reinterpret_cast<void*>(*address);
}

void RematCudaAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  cuda::DeviceArena* arena = FindOwner(ptr);
  if (arena == nullptr) {
    TORCH_WARN("remat: freeing CUDA pointer ", ptr, " that this allocator does not own; ignored");
    return;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (MemoryHistoryEnabled()) {
    RecordMemoryEvent(MemoryEventKind::kFree, address, arena->BlockSize(address).value_or(0), 0,
                      static_cast<std::int16_t>(arena->device()));
  }
  const absl::Status status = arena->Free(address);
  if (!status.ok()) TORCH_WARN("remat: ", std::string(status.message()));
}

void RematCudaAllocator::RecordStream(void* ptr, cudaStream_t stream) {
  cuda::DeviceArena* arena = FindOwner(ptr);
  TORCH_CHECK(arena != nullptr, "remat: record_stream on CUDA pointer ", ptr, " that remat did not allocate");
  const absl::Status status = arena->RecordStream(reinterpret_cast<std::uintptr_t>(ptr), stream);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

c10::DataPtr RematCudaAllocator::allocate(std::size_t bytes) {
  absl::StatusOr<int> device = runtime_->GetDevice();
  TORCH_CHECK(device.ok(), "remat: ", std::string(device.status().message()));
  const auto index = static_cast<c10::DeviceIndex>(*device);
  const c10::Device where(c10::DeviceType::CUDA, index);
  if (bytes == 0) return c10::DataPtr(nullptr, nullptr, &RawDelete, where);
  void* ptr = Malloc(bytes, index, streams_.current(index));
  return c10::DataPtr(ptr, ptr, &RawDelete, where);
}

c10::DeleterFnPtr RematCudaAllocator::raw_deleter() const { return &RawDelete; }

void RematCudaAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  absl::Status status = runtime_->MemcpyAsync(dest, src, count, cuda::CopyKind::kDeviceToDevice, nullptr);
  if (status.ok()) status = runtime_->StreamSynchronize(nullptr);
  TORCH_CHECK(status.ok(), "remat: ", std::string(status.message()));
}

bool RematCudaAllocator::initialized() {
  std::lock_guard<std::mutex> lock(mu_);
  return initialized_;
}

void RematCudaAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  if (mempool_id != c10::MempoolId_t{0, 0}) Unsupported("emptyCache on a private memory pool (CUDA graphs)");
  for (const auto& slot : devices_) {
    cuda::DeviceArena* arena = slot.load(std::memory_order_acquire);
    if (arena == nullptr) continue;
    const absl::Status status = arena->EmptyCache();
    TORCH_CHECK(status.ok(), std::string(status.message()));
  }
}

c10::CachingDeviceAllocator::DeviceStats RematCudaAllocator::getDeviceStats(c10::DeviceIndex device) {
  const cuda::DeviceArenaStats s = Device(device).Stats();
  c10::CachingDeviceAllocator::DeviceStats out;
  CopyStat(s.allocation, out.allocation);
  CopyStat(s.segment, out.segment);
  CopyStat(s.active, out.active);
  CopyStat(s.allocated_bytes, out.allocated_bytes);
  CopyStat(s.reserved_bytes, out.reserved_bytes);
  CopyStat(s.active_bytes, out.active_bytes);
  CopyStat(s.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = s.pressure_allocations;
  out.num_ooms = s.ooms;
  out.num_sync_all_streams = s.synchronizations;
  out.num_device_alloc = s.device_mallocs;
  out.num_device_free = s.device_frees;
  out.max_split_size = std::numeric_limits<std::int64_t>::max();  // remat splits every block
  return out;
}

void RematCudaAllocator::resetAccumulatedStats(c10::DeviceIndex device) { Device(device).ResetAccumulated(); }

void RematCudaAllocator::resetPeakStats(c10::DeviceIndex device) { Device(device).ResetPeak(); }

std::pair<std::size_t, std::size_t> RematCudaAllocator::getMemoryInfo(c10::DeviceIndex device) {
  cuda::ScopedDevice guard(runtime_, device);
  TORCH_CHECK(guard.status().ok(), "remat: ", std::string(guard.status().message()));
  absl::StatusOr<cuda::DeviceMemoryInfo> info = runtime_->MemGetInfo();
  TORCH_CHECK(info.ok(), "remat: ", std::string(info.status().message()));
  return {info->free, info->total};
}

void* RematCudaAllocator::raw_alloc(std::size_t nbytes) {
  absl::StatusOr<int> device = runtime_->GetDevice();
  TORCH_CHECK(device.ok(), "remat: ", std::string(device.status().message()));
  const auto index = static_cast<c10::DeviceIndex>(*device);
  return raw_alloc_with_stream(nbytes, streams_.current(index));
}

void* RematCudaAllocator::raw_alloc_with_stream(std::size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  absl::StatusOr<int> device = runtime_->GetDevice();
  TORCH_CHECK(device.ok(), "remat: ", std::string(device.status().message()));
  return Malloc(nbytes, static_cast<c10::DeviceIndex>(*device), stream);
}

void RematCudaAllocator::raw_delete(void* ptr) { Free(ptr); }

void RematCudaAllocator::init(int device_count) {
  std::lock_guard<std::mutex> lock(mu_);
  device_count_ = std::min(device_count, kMaxDevices);
  initialized_ = true;
}

double RematCudaAllocator::getMemoryFraction(c10::DeviceIndex device) {
  absl::StatusOr<std::size_t> budget = Device(device).Budget();
  TORCH_CHECK(budget.ok(), std::string(budget.status().message()));
  const std::size_t total = getMemoryInfo(device).second;
  return total == 0 ? 0.0 : static_cast<double>(*budget) / static_cast<double>(total);
}

void RematCudaAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  const absl::Status status = Device(device).SetBudgetFraction(fraction);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

std::vector<cca::StreamSegmentSize> RematCudaAllocator::getExpandableSegmentSizes(c10::DeviceIndex device) {
  return {};  // remat's segments are never expandable
}

void RematCudaAllocator::enable(bool value) { enabled_.store(value); }

bool RematCudaAllocator::isEnabled() const { return enabled_.load(); }

void RematCudaAllocator::cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) {
  *largest_block = Device(device).LargestFreeBlock();
}

void* RematCudaAllocator::getBaseAllocation(void* ptr, std::size_t* size) {
  cuda::DeviceArena* arena = FindOwner(ptr);
  if (arena == nullptr) {
    for (const auto& slot : devices_) {
      cuda::DeviceArena* candidate = slot.load(std::memory_order_acquire);
      if (candidate != nullptr && candidate->SegmentOf(reinterpret_cast<std::uintptr_t>(ptr)).ok()) {
        arena = candidate;
        break;
      }
    }
  }
  TORCH_CHECK(arena != nullptr, "remat: getBaseAllocation of CUDA pointer ", ptr, " that remat did not allocate");
  absl::StatusOr<Segment> segment = arena->SegmentOf(reinterpret_cast<std::uintptr_t>(ptr));
  TORCH_CHECK(segment.ok(), std::string(segment.status().message()));
  if (size != nullptr) *size = segment->size;
  return reinterpret_cast<void*>(segment->base);
}

void RematCudaAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (ptr.get() == nullptr || ptr.get_deleter() != &RawDelete) return;  // not ours (as PyTorch's allocator does)
  RecordStream(ptr.get(), streams_.handle(stream));
}

cca::SnapshotInfo RematCudaAllocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  if (mempool_id != c10::MempoolId_t{0, 0}) Unsupported("snapshots of a private memory pool (CUDA graphs)");
  cca::SnapshotInfo info;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    cuda::DeviceArena* arena = devices_[d].load(std::memory_order_acquire);
    if (arena == nullptr) continue;
    const std::vector<BlockInfo> blocks = arena->Blocks();
    if (blocks.empty()) continue;
    for (auto& segment : SnapshotSegments(blocks, arena->Stats().granule, static_cast<c10::DeviceIndex>(d))) {
      info.segments.push_back(std::move(segment));
    }
  }
  if (include_traces) {
    std::size_t devices = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      devices = static_cast<std::size_t>(DeviceCountLocked());
    }
    info.device_traces = CudaDeviceTraces(CopyMemoryHistory(), devices);  // one per device, as torch's
  }
  return info;
}

void RematCudaAllocator::beginAllocateToPool(c10::DeviceIndex, c10::MempoolId_t, std::function<bool(cudaStream_t)>) {
  Unsupported("CUDA graph private memory pools (beginAllocateToPool: CUDA graph capture, torch.cuda.MemPool)");
}

void RematCudaAllocator::endAllocateToPool(c10::DeviceIndex, c10::MempoolId_t) {
  Unsupported("CUDA graph private memory pools (endAllocateToPool)");
}

void RematCudaAllocator::releasePool(c10::DeviceIndex, c10::MempoolId_t) {
  Unsupported("CUDA graph private memory pools (releasePool)");
}

cca::ShareableHandle RematCudaAllocator::shareIpcHandle(void*) {
  Unsupported("CUDA IPC (sharing CUDA tensors between processes: shareIpcHandle)");
}

std::shared_ptr<void> RematCudaAllocator::getIpcDevPtr(std::string) {
  Unsupported("CUDA IPC (opening CUDA tensors of another process: getIpcDevPtr)");
}

bool RematCudaAllocator::isHistoryEnabled() { return MemoryHistoryEnabled(); }

// torch.cuda.memory._record_memory_history: remat's memory history (memory_events.h), shared with the CPU arena and
// remat.record_memory_history. The context recorder (Python and C++ stacks) is not called: events carry remat's
// own context instead.
void RematCudaAllocator::recordHistory(bool enabled, cca::CreateContextFn, std::size_t max_entries,
                                       cca::RecordContext when, bool, const std::vector<std::string>&) {
  if (enabled && when != cca::RecordContext::NEVER) {
    StartMemoryHistory(max_entries);
  } else {
    StopMemoryHistory();
  }
}

void RematCudaAllocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  oom_observers_.push_back(std::move(observer));
}

void RematCudaAllocator::attachOomRejectionObserver(cca::OomRejectionObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  oom_rejection_observers_.push_back(std::move(observer));  // never called: remat rejects nothing preemptively
}

void RematCudaAllocator::attachAllocatorTraceTracker(cca::AllocatorTraceTracker) {
  Unsupported("allocator trace trackers (attachAllocatorTraceTracker)");
}

void RematCudaAllocator::enablePeerAccess(c10::DeviceIndex, c10::DeviceIndex) {
  // cudaMalloc'd memory is copied across devices by cudaMemcpyAsync with or without peer access.
}

cudaError_t RematCudaAllocator::memcpyAsync(void* dst, int, const void* src, int, std::size_t count,
                                            cudaStream_t stream, bool) {
  const absl::Status status = runtime_->MemcpyAsync(dst, src, count, cuda::CopyKind::kDeviceToDevice, stream);
  return status.ok() ? cudaSuccess : cudaErrorUnknown;
}

std::shared_ptr<cca::AllocatorState> RematCudaAllocator::getCheckpointState(c10::DeviceIndex, c10::MempoolId_t) {
  Unsupported("CUDA graph pool checkpoints (getCheckpointState, used by CUDA graph trees)");
}

cca::CheckpointDelta RematCudaAllocator::setCheckpointPoolState(c10::DeviceIndex,
                                                                std::shared_ptr<cca::AllocatorState>) {
  Unsupported("CUDA graph pool checkpoints (setCheckpointPoolState, used by CUDA graph trees)");
}

std::string RematCudaAllocator::name() { return "remat"; }

void RematCudaAllocator::SetPressureHandler(c10::DeviceIndex device, PressureHandler* handler) {
  Device(device).SetPressureHandler(handler);
}

absl::StatusOr<cuda::CudaPager*> RematCudaAllocator::Pager(c10::DeviceIndex device) {
  cuda::DeviceArena& arena = Device(device);
  std::lock_guard<std::mutex> lock(mu_);
  PagingState& paging = paging_[static_cast<std::size_t>(device)];
  if (paging.pager != nullptr) return paging.pager.get();
  if (options_.host_budget == 0) {
    return absl::FailedPreconditionError(
        "remat: paging needs a pinned host budget (REMAT_HOST_BUDGET or CudaAllocatorOptions::host_budget)");
  }
  absl::StatusOr<std::unique_ptr<cuda::PinnedHostPool>> pool =
      cuda::PinnedHostPool::Create(runtime_, options_.host_budget);
  if (!pool.ok()) return pool.status();
  absl::StatusOr<std::unique_ptr<cuda::CudaPager>> pager = cuda::CudaPager::Create(runtime_, &arena, pool->get());
  if (!pager.ok()) return pager.status();
  paging.pool = std::move(*pool);
  paging.pager = std::move(*pager);
  return paging.pager.get();
}

// ---- installation -------------------------------------------------------------------------------------------

namespace {

std::mutex g_install_mutex;
RematCudaAllocator* g_installed = nullptr;           // guarded by g_install_mutex
cca::CUDAAllocator* g_previous = nullptr;            // c10's atomic allocator before ours; guarded by g_install_mutex
c10::Allocator* g_previous_c10 = nullptr;            // c10::GetAllocator(kCUDA) before ours; guarded by g_install_mutex
std::uint8_t g_priority = 0;

bool SetAtCurrentPriority(c10::Allocator* allocator, std::uint8_t* priority) {
  for (int p = 0; p <= std::numeric_limits<std::uint8_t>::max(); ++p) {
    c10::SetAllocator(c10::DeviceType::CUDA, allocator, static_cast<std::uint8_t>(p));
    if (c10::GetAllocator(c10::DeviceType::CUDA) == allocator) {
      *priority = static_cast<std::uint8_t>(p);
      return true;
    }
  }
  return false;
}

}  // namespace

absl::Status InstallCudaAllocator(RematCudaAllocator* allocator) {
  if (allocator == nullptr) return absl::InvalidArgumentError("remat: no CUDA allocator to install");
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed != nullptr) {
    return absl::AlreadyExistsError("remat: a remat CUDA allocator is already installed");
  }
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current != nullptr && current != allocator && current->initialized()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "remat: CUDA is already initialized with PyTorch's allocator (", current->name(),
        "), so remat cannot become the CUDA allocator: install it before the first CUDA tensor, stream or "
        "torch.cuda call that initializes CUDA (e.g. call remat.install_cuda_allocator() or set REMAT_BUDGET "
        "before `import remat`, at the top of the script)"));
  }
  std::uint8_t priority = 0;
  c10::Allocator* current_c10 = c10::GetAllocator(c10::DeviceType::CUDA);
  cca::allocator.store(allocator);
  if (!SetAtCurrentPriority(allocator, &priority)) {
    cca::allocator.store(current);
    return absl::FailedPreconditionError("remat: c10 refused the CUDA allocator at every priority");
  }
  g_previous = current;
  g_previous_c10 = current_c10;
  g_priority = priority;
  g_installed = allocator;
  return absl::OkStatus();
}

absl::Status UninstallCudaAllocator() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed == nullptr) return absl::FailedPreconditionError("remat: no remat CUDA allocator is installed");
  cca::allocator.store(g_previous);
  if (g_previous_c10 != nullptr) c10::SetAllocator(c10::DeviceType::CUDA, g_previous_c10, g_priority);
  g_installed = nullptr;
  return absl::OkStatus();
}

RematCudaAllocator* InstalledCudaAllocator() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  return g_installed;
}

absl::StatusOr<RematCudaAllocator*> InstallNewCudaAllocator(cuda::CudaRuntime* runtime,
                                                            const CudaAllocatorOptions& options, CudaStreams streams) {
  if (runtime == nullptr) return absl::InvalidArgumentError("remat: the CUDA allocator needs a CUDA runtime");
  if (options.budget == 0 && !(options.budget_fraction > 0 && options.budget_fraction <= 1)) {
    return absl::InvalidArgumentError("remat: the CUDA budget must be > 0 bytes or a fraction in (0, 1]");
  }
  if (InstalledCudaAllocator() != nullptr) {
    return absl::AlreadyExistsError("remat: a remat CUDA allocator is already installed");
  }
  // Before touching the device: once CUDA is initialized, InstallCudaAllocator's message is the useful one.
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current == nullptr || !current->initialized()) {
    absl::StatusOr<int> count = runtime->DeviceCount();
    if (!count.ok() || *count <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "remat: no CUDA device is available, so remat's CUDA allocator cannot be installed (",
          count.ok() ? "the CUDA runtime reports 0 devices" : std::string(count.status().message()),
          "). It needs an NVIDIA GPU and a driver that supports the CUDA version torch was built for."));
    }
  }
  // Never destroyed here: StorageImpls and c10 keep pointers to it.
  auto* allocator = new RematCudaAllocator(runtime, options, std::move(streams));
  absl::Status status = InstallCudaAllocator(allocator);
  if (!status.ok()) {
    delete allocator;
    return status;
  }
  return allocator;
}

absl::Status InstallRematCudaAllocator(const CudaAllocatorOptions& options) {
  return InstallNewCudaAllocator(cuda::RealCudaRuntime(), options, TorchCudaStreams()).status();
}

CudaStreams TorchCudaStreams() {
  CudaStreams streams;
  streams.current = [](c10::DeviceIndex device) { return c10::cuda::getCurrentCUDAStream(device).stream(); };
  streams.handle = [](const c10::cuda::CUDAStream& stream) { return stream.stream(); };
  return streams;
}

void SetCudaPlacementForThisThread(Placement placement) { t_placement = placement; }

}  // namespace remat::integration
