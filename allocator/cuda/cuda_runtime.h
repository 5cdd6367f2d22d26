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
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat::cuda {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kDefault };

struct DeviceMemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

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
