// CudaRuntime: the narrow seam between remat's CUDA code and the CUDA runtime (DESIGN.md, "allocator/": cuda).
//
// Every CUDA runtime call that remat's allocator, pinned host pool and pager make goes through this interface, so
// that all of their logic runs in CI against a test double over host memory (tests/cuda/fake_cuda_runtime.h):
// there is no GPU on our machines. The real implementation (MakeCudaRuntime, cudart_runtime.cc) is one line per
// call and holds no logic.
//
// Contract (mirrors the CUDA runtime; only what remat needs):
//   - Handles are CUDA's own types (cudaStream_t, cudaEvent_t) so that streams torch hands us pass through
//     unchanged. nullptr is the legacy default stream.
//   - Calls act on the calling thread's current device (SetDevice/GetDevice), like the runtime.
//   - Every call returns a Status; a CUDA error becomes an error whose message names the call and CUDA's own
//     error string. Out-of-memory from DeviceMalloc / HostAllocPinned is ResourceExhausted.
//   - MemcpyAsync, EventRecord and StreamWaitEvent are ordered on their stream; EventQuery is true once all work
//     before the most recent EventRecord of that event has finished (true for an event never recorded).
//   - Events are created without timing (cudaEventDisableTiming): they only order and report completion.
//   - Virtual memory management (the driver's cuMem* calls, for the stitching arena, issue 18): address space is
//     reserved apart from physical memory; a physical allocation (a handle) is mapped into reserved space and is
//     usable only after SetAccess grants the device read-write access there. UnmapPhysical gives the range back to
//     the reservation (what ran on it must have finished: the host waits first, DeviceSynchronize); a handle is
//     released only once nothing maps it; a reservation is freed only once nothing is mapped in it. Sizes and
//     addresses are multiples of the device's granularity (VirtualMemory).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat::cuda {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kDefault };

struct DeviceMemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

// What a device offers for virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
// cuMemGetAllocationGranularity's recommended granularity; 0 when unsupported).
struct VirtualMemorySupport {
  bool supported = false;
  std::size_t granularity = 0;
};

// A physical allocation (CUmemGenericAllocationHandle).
using PhysicalHandle = unsigned long long;

class CudaRuntime {
 public:
  virtual ~CudaRuntime() = default;

  virtual absl::StatusOr<int> DeviceCount() = 0;
  virtual absl::StatusOr<int> GetDevice() = 0;
  virtual absl::Status SetDevice(int device) = 0;
  virtual absl::StatusOr<DeviceMemoryInfo> MemGetInfo() = 0;  // of the current device

  virtual absl::StatusOr<void*> DeviceMalloc(std::size_t bytes) = 0;  // cudaMalloc on the current device
  virtual absl::Status DeviceFree(void* pointer) = 0;
  virtual absl::StatusOr<void*> HostAllocPinned(std::size_t bytes) = 0;  // cudaHostAlloc(cudaHostAllocDefault)
  virtual absl::Status HostFreePinned(void* pointer) = 0;

  virtual absl::Status MemcpyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                                   cudaStream_t stream) = 0;

  virtual absl::StatusOr<cudaStream_t> StreamCreate() = 0;  // non-blocking w.r.t. the legacy default stream
  virtual absl::Status StreamDestroy(cudaStream_t stream) = 0;
  virtual absl::Status StreamSynchronize(cudaStream_t stream) = 0;
  virtual absl::StatusOr<bool> StreamQuery(cudaStream_t stream) = 0;  // true: all work on it has finished
  virtual absl::Status StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) = 0;

  virtual absl::StatusOr<cudaEvent_t> EventCreate() = 0;
  virtual absl::Status EventRecord(cudaEvent_t event, cudaStream_t stream) = 0;
  virtual absl::StatusOr<bool> EventQuery(cudaEvent_t event) = 0;
  virtual absl::Status EventSynchronize(cudaEvent_t event) = 0;
  virtual absl::Status EventDestroy(cudaEvent_t event) = 0;
  virtual absl::Status DeviceSynchronize() = 0;  // the current device

  // Virtual memory management (above). Device arguments name the device; the current device is not used.
  virtual absl::StatusOr<VirtualMemorySupport> VirtualMemory(int device) = 0;
  virtual absl::StatusOr<std::uintptr_t> AddressReserve(std::size_t bytes, std::size_t alignment) = 0;
  virtual absl::Status AddressFree(std::uintptr_t address, std::size_t bytes) = 0;
  virtual absl::StatusOr<PhysicalHandle> PhysicalCreate(std::size_t bytes, int device) = 0;  // ResourceExhausted
  virtual absl::Status PhysicalRelease(PhysicalHandle handle) = 0;
  virtual absl::Status MapPhysical(std::uintptr_t address, std::size_t bytes, PhysicalHandle handle) = 0;
  virtual absl::Status SetAccess(std::uintptr_t address, std::size_t bytes, int device) = 0;  // read-write
  virtual absl::Status UnmapPhysical(std::uintptr_t address, std::size_t bytes) = 0;
};

// Switches the calling thread's current device to `device` for its lifetime (a no-op when it already is), like
// c10::cuda::CUDAGuard; events and copies must be issued on the device of their stream. Errors are kept in
// status() rather than thrown.
class ScopedDevice {
 public:
  ScopedDevice(CudaRuntime* runtime, int device) : runtime_(runtime) {
    absl::StatusOr<int> current = runtime_->GetDevice();
    if (!current.ok()) {
      status_ = current.status();
      return;
    }
    if (*current != device) {
      status_ = runtime_->SetDevice(device);
      if (status_.ok()) previous_ = *current;
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) (void)runtime_->SetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  CudaRuntime* runtime_;
  int previous_ = -1;
  absl::Status status_;
};

// The real runtime over libcudart (process-wide, never destroyed). Linked from remat_cuda_runtime only.
CudaRuntime* RealCudaRuntime();

}  // namespace remat::cuda
