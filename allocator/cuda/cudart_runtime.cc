// The real CudaRuntime: one cudart call per method, no logic (everything testable lives above the seam).
// Not exercised in CI (there is no device); see cuda_runtime.h for the contract.
#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/cuda/cuda_runtime.h"

namespace remat::cuda {
namespace {

absl::Status Check(cudaError_t error, const std::string& call) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  cudaGetLastError();  // reset the runtime's last-error state (a non-sticky error must not leak into later calls)
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

cudaMemcpyKind KindOf(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
    case CopyKind::kDefault: return cudaMemcpyDefault;
  }
  return cudaMemcpyDefault;
}

class Cudart final : public CudaRuntime {
 public:
  absl::StatusOr<int> DeviceCount() override {
    int count = 0;
    absl::Status status = Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (!status.ok()) return status;
    return count;
  }
  absl::StatusOr<int> GetDevice() override {
    int device = 0;
    absl::Status status = Check(cudaGetDevice(&device), "cudaGetDevice");
    if (!status.ok()) return status;
    return device;
  }
  absl::Status SetDevice(int device) override { return Check(cudaSetDevice(device), "cudaSetDevice"); }
  absl::StatusOr<DeviceMemoryInfo> MemGetInfo() override {
    DeviceMemoryInfo info;
    absl::Status status = Check(cudaMemGetInfo(&info.free, &info.total), "cudaMemGetInfo");
    if (!status.ok()) return status;
    return info;
  }
  absl::StatusOr<void*> DeviceMalloc(std::size_t bytes) override {
    void* pointer = nullptr;
    absl::Status status = Check(cudaMalloc(&pointer, bytes), absl::StrCat("cudaMalloc(", bytes, ")"));
    if (!status.ok()) return status;
    return pointer;
  }
  absl::Status DeviceFree(void* pointer) override { return Check(cudaFree(pointer), "cudaFree"); }
  absl::StatusOr<void*> HostAllocPinned(std::size_t bytes) override {
    void* pointer = nullptr;
    absl::Status status = Check(cudaHostAlloc(&pointer, bytes, cudaHostAllocDefault),
                                absl::StrCat("cudaHostAlloc(", bytes, ")"));
    if (!status.ok()) return status;
    return pointer;
  }
  absl::Status HostFreePinned(void* pointer) override { return Check(cudaFreeHost(pointer), "cudaFreeHost"); }
  absl::Status MemcpyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                           cudaStream_t stream) override {
    return Check(cudaMemcpyAsync(dst, src, bytes, KindOf(kind), stream), "cudaMemcpyAsync");
  }
  absl::StatusOr<cudaStream_t> StreamCreate() override {
    cudaStream_t stream = nullptr;
    absl::Status status = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!status.ok()) return status;
    return stream;
  }
  absl::Status StreamDestroy(cudaStream_t stream) override {
    return Check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }
  absl::Status StreamSynchronize(cudaStream_t stream) override {
    return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  absl::StatusOr<bool> StreamQuery(cudaStream_t stream) override {
    const cudaError_t error = cudaStreamQuery(stream);
    if (error == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    absl::Status status = Check(error, "cudaStreamQuery");
    if (!status.ok()) return status;
    return true;
  }
  absl::Status StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) override {
    return Check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
  }
  absl::StatusOr<cudaEvent_t> EventCreate() override {
    cudaEvent_t event = nullptr;
    absl::Status status = Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    if (!status.ok()) return status;
    return event;
  }
  absl::Status EventRecord(cudaEvent_t event, cudaStream_t stream) override {
    return Check(cudaEventRecord(event, stream), "cudaEventRecord");
  }
  absl::StatusOr<bool> EventQuery(cudaEvent_t event) override {
    const cudaError_t error = cudaEventQuery(event);
    if (error == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    absl::Status status = Check(error, "cudaEventQuery");
    if (!status.ok()) return status;
    return true;
  }
  absl::Status EventSynchronize(cudaEvent_t event) override {
    return Check(cudaEventSynchronize(event), "cudaEventSynchronize");
  }
  absl::Status EventDestroy(cudaEvent_t event) override { return Check(cudaEventDestroy(event), "cudaEventDestroy"); }
};

}  // namespace

CudaRuntime* RealCudaRuntime() {
  static auto* runtime = new Cudart();
  return runtime;
}

}  // namespace remat::cuda
