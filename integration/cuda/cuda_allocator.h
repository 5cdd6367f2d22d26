// RematCudaAllocator: remat as PyTorch's CUDA allocator (DESIGN.md, "PyTorch integration": CUDA).
//
// A c10::cuda::CUDACachingAllocator::CUDAAllocator over one cuda::DeviceArena per device (allocator/cuda/): the
// budget is a hard limit on each device, reserved as one cudaMalloc'd segment at the device's first allocation.
// Everything CUDA goes through the cuda::CudaRuntime seam given to the constructor, and the streams through the
// CudaStreams given with it, so the whole class runs in CI against the test double. Only
// InstallRematCudaAllocator (the production entry) wires the real cudart and c10::cuda::getCurrentCUDAStream.
//
// What PyTorch users get:
//   - allocate / raw_alloc[_with_stream] / raw_delete with stream-ordered reuse and recordStream (DeviceArena).
//     A DataPtr's context is its data pointer; the deleter finds the owning allocator, so raw_deleter() is honest.
//   - Out of budget: the arena's pressure handler (the runtime, SetPressureHandler) is asked to evict; if nothing
//     can be freed the call throws c10::OutOfMemoryError (torch.OutOfMemoryError) naming the request, the budget,
//     what is allocated and pending, and the largest free block. Out-of-memory observers are called first.
//   - Stats: getDeviceStats (memory_allocated, memory_reserved, max_memory_allocated, memory_stats), resetPeakStats,
//     resetAccumulatedStats, emptyCache (waits for pending frees; gives the segment back when nothing is
//     allocated), cacheInfo (largest free block, or the budget before the first allocation), getMemoryInfo,
//     snapshot (segments and blocks), getBaseAllocation, get/setMemoryFraction (the budget as a fraction of device
//     memory; changing it needs an empty device).
//   - Memory history: recordHistory (torch.cuda.memory._record_memory_history) starts and stops remat's memory
//     history (integration/memory_events.h), and snapshot's device traces are that history (cuda_history.h):
//     allocations, frees, OOMs, and remat's evictions, rematerializations and page transfers as annotations.
//     torch's context recorder is not called (no Python stacks).
//   - Paging primitive: Pager(device) copies blocks to a pinned host pool on a copy stream (allocator/cuda/pager.h).
//   - Unsupported, failing with a c10::Error that says "remat does not support ...": CUDA graph private pools
//     (beginAllocateToPool, endAllocateToPool, releasePool, checkpoint state), CUDA IPC (shareIpcHandle,
//     getIpcDevPtr), allocator trace trackers, and non-default
//     mempool ids in emptyCache/snapshot. enablePeerAccess is a no-op (cudaMalloc memory copies across devices
//     without it); OOM-rejection observers are accepted and never called (remat never rejects preemptively).
//
// Installation (InstallCudaAllocator) stores the allocator in c10's atomic `allocator` and registers it with
// c10::SetAllocator(kCUDA); it must happen before CUDA initializes: if the allocator already installed reports
// initialized() (torch ran its CUDA lazy init), installation fails with FailedPrecondition saying so. The
// production path (InstallNewCudaAllocator) also refuses when the runtime sees no CUDA device.
// Thread safety: all allocator methods may be called from any thread. Install/Uninstall must not race.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "allocator/cuda/cuda_runtime.h"
#include "allocator/cuda/device_arena.h"
#include "allocator/cuda/pager.h"
#include "allocator/cuda/pinned_host_pool.h"

namespace remat::integration {

struct CudaAllocatorOptions {
  std::size_t budget = 0;          // bytes per device; when 0, `budget_fraction` of each device's memory
  double budget_fraction = 0;      // in (0, 1]
  std::size_t host_budget = 0;     // pinned host bytes for paging (per device); 0: paging unavailable
  // Each device's arena: contiguous, or stitching granules where the device supports virtual memory management
  // (cuda::DeviceArenaKind; issue 18). `stitch_granule` 0 takes the device's granularity, at least 2 MiB.
  cuda::DeviceArenaKind arena = cuda::DeviceArenaKind::kContiguous;
  std::size_t stitch_granule = 0;
};

// How the allocator learns about torch's streams. Both touch the CUDA driver in production, so they are injected:
//   current  the stream torch considers current on a device (c10::cuda::getCurrentCUDAStream(d).stream())
//   handle   the cudaStream_t behind a c10 CUDAStream (CUDAStream::stream())
struct CudaStreams {
  std::function<cudaStream_t(c10::DeviceIndex)> current;
  std::function<cudaStream_t(const c10::cuda::CUDAStream&)> handle;
};
// The production functions above.
CudaStreams TorchCudaStreams();

class RematCudaAllocator final : public c10::cuda::CUDACachingAllocator::CUDAAllocator {
 public:
  static constexpr int kMaxDevices = 64;

  // `runtime` is not owned and must outlive the allocator. Throws c10::Error for invalid options.
  RematCudaAllocator(cuda::CudaRuntime* runtime, CudaAllocatorOptions options, CudaStreams streams);
  ~RematCudaAllocator() override;

  // c10::Allocator
  c10::DataPtr allocate(std::size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // c10::DeviceAllocator
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<std::size_t, std::size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // CUDAAllocator
  void* raw_alloc(std::size_t nbytes) override;
  void* raw_alloc_with_stream(std::size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<c10::cuda::CUDACachingAllocator::StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, std::size_t* size) override;
  using CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot(c10::MempoolId_t mempool_id = {0, 0},
                                                         bool include_traces = true) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  c10::cuda::CUDACachingAllocator::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, c10::cuda::CUDACachingAllocator::CreateContextFn context_recorder,
                     std::size_t alloc_trace_max_entries, c10::cuda::CUDACachingAllocator::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override;
  void attachOutOfMemoryObserver(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer) override;
  void attachOomRejectionObserver(c10::cuda::CUDACachingAllocator::OomRejectionObserver observer) override;
  void attachAllocatorTraceTracker(c10::cuda::CUDACachingAllocator::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, std::size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> getCheckpointState(
      c10::DeviceIndex device, c10::MempoolId_t id) override;
  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> pps) override;
  std::string name() override;

  // remat's own API.
  // Allocates on `device` for `stream`; throws c10::OutOfMemoryError when the budget cannot hold it.
  void* Malloc(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream);
  // Frees a pointer Malloc returned (stream-ordered). Unknown pointers: warns and ignores.
  void Free(void* ptr);
  void RecordStream(void* ptr, cudaStream_t stream);
  bool Owns(const void* ptr) const;
  // The device's arena (created on first use). Throws c10::Error for a device outside [0, device count).
  cuda::DeviceArena& Device(c10::DeviceIndex device);
  // The hook the runtime evicts through on `device` (nullptr: none). Not owned.
  void SetPressureHandler(c10::DeviceIndex device, PressureHandler* handler);
  // The paging primitive for `device`: FailedPrecondition when host_budget is 0.
  absl::StatusOr<cuda::CudaPager*> Pager(c10::DeviceIndex device);
  cuda::CudaRuntime* runtime() const { return runtime_; }
  // The stream torch considers current on `device` (CudaStreams::current).
  cudaStream_t CurrentStream(c10::DeviceIndex device) const { return streams_.current(device); }

 private:
  struct PagingState {
    std::unique_ptr<cuda::PinnedHostPool> pool;
    std::unique_ptr<cuda::CudaPager> pager;
  };

  cuda::DeviceArena* FindOwner(const void* ptr) const;
  int DeviceCountLocked();
  [[noreturn]] void ThrowOutOfMemory(c10::DeviceIndex device, std::size_t bytes, const absl::Status& status);

  cuda::CudaRuntime* runtime_;
  CudaAllocatorOptions options_;
  CudaStreams streams_;
  mutable std::mutex mu_;  // guards creation of devices and paging state, the observers, device_count_
  int device_count_ = -1;
  bool initialized_ = false;
  std::atomic<bool> enabled_{true};
  std::array<std::atomic<cuda::DeviceArena*>, kMaxDevices> devices_{};
  std::vector<std::unique_ptr<cuda::DeviceArena>> owned_devices_;
  std::array<PagingState, kMaxDevices> paging_{};
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> oom_observers_;
  std::vector<c10::cuda::CUDACachingAllocator::OomRejectionObserver> oom_rejection_observers_;
};

// Makes `allocator` c10's CUDA allocator. Not owned: it must stay alive while installed and while any memory it
// handed out lives (the production one never dies). AlreadyExists when it is installed; FailedPrecondition when
// CUDA was already initialized with another allocator.
absl::Status InstallCudaAllocator(RematCudaAllocator* allocator);
// Gives c10 back the allocator that was installed before. FailedPrecondition when remat's is not installed.
absl::Status UninstallCudaAllocator();
// The installed remat CUDA allocator, or nullptr.
RematCudaAllocator* InstalledCudaAllocator();

// Makes a new RematCudaAllocator over `runtime` and installs it. Checked first, in this order, each failing without
// installing anything: invalid options (InvalidArgument); a remat allocator already installed (AlreadyExists); CUDA
// already initialized (FailedPrecondition, as InstallCudaAllocator); no CUDA device (FailedPrecondition saying so
// and quoting the runtime's error, e.g. no driver). The allocator is never destroyed by remat (StorageImpls and
// c10 keep pointers to it); a caller that uninstalls it and has freed everything may delete it (tests do).
absl::StatusOr<RematCudaAllocator*> InstallNewCudaAllocator(cuda::CudaRuntime* runtime,
                                                            const CudaAllocatorOptions& options, CudaStreams streams);

// Production: InstallNewCudaAllocator over the real CUDA runtime and torch's current streams.
absl::Status InstallRematCudaAllocator(const CudaAllocatorOptions& options);

// Which end of a free block this thread's next CUDA allocations take (Coop partitioning). Default kLow.
void SetCudaPlacementForThisThread(Placement placement);

}  // namespace remat::integration
