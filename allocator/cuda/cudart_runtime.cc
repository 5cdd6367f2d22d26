// The real CudaRuntime: one cudart call per method, no logic (everything testable lives above the seam).
// Not exercised in CI (there is no device); see cuda_runtime.h for the contract.
#include <cuda.h>
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

// The driver's virtual memory calls, found through cudart (cudaGetDriverEntryPointByVersion) so that the library
// links against cudart alone and loads on machines without a driver; resolved once, at the first use.
struct DriverVmm {
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  absl::Status status;  // why the entry points could not be found
};

template <typename Function>
absl::Status Resolve(const char* name, Function* out) {
  void* pointer = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = cudaGetDriverEntryPointByVersion(name, &pointer, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || pointer == nullptr) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("the CUDA driver has no ", name, " (", cudaGetErrorString(error), ")"));
  }
  *out = reinterpret_cast<Function>(pointer);
  return absl::OkStatus();
}

const DriverVmm& Vmm() {
  static const DriverVmm* vmm = [] {
    auto* v = new DriverVmm();
    for (absl::Status s : {Resolve("cuGetErrorString", &v->get_error_string), Resolve("cuDeviceGet", &v->device_get),
                           Resolve("cuDeviceGetAttribute", &v->device_attribute),
                           Resolve("cuMemGetAllocationGranularity", &v->granularity),
                           Resolve("cuMemAddressReserve", &v->address_reserve),
                           Resolve("cuMemAddressFree", &v->address_free), Resolve("cuMemCreate", &v->create),
                           Resolve("cuMemRelease", &v->release), Resolve("cuMemMap", &v->map),
                           Resolve("cuMemSetAccess", &v->set_access), Resolve("cuMemUnmap", &v->unmap)}) {
      if (!s.ok() && v->status.ok()) v->status = s;
    }
    return v;
  }();
  return *vmm;
}

absl::Status CheckDriver(CUresult result, const std::string& call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = "unknown error";
  if (Vmm().get_error_string != nullptr) (void)Vmm().get_error_string(result, &text);
  const std::string message = absl::StrCat(call, ": CUresult ", static_cast<int>(result), ": ", text);
  if (result == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
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
  absl::Status DeviceSynchronize() override { return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

  absl::StatusOr<VirtualMemorySupport> VirtualMemory(int device) override {
    if (!Vmm().status.ok()) return VirtualMemorySupport{};  // a driver without the calls: no stitching
    CUdevice handle = 0;
    absl::Status status = CheckDriver(Vmm().device_get(&handle, device), "cuDeviceGet");
    if (!status.ok()) return status;
    int supported = 0;
    status = CheckDriver(
        Vmm().device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle),
        "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    if (!status.ok()) return status;
    if (supported == 0) return VirtualMemorySupport{};
    const CUmemAllocationProp prop = DeviceProp(device);
    size_t granularity = 0;
    status = CheckDriver(Vmm().granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                         "cuMemGetAllocationGranularity");
    if (!status.ok()) return status;
    return VirtualMemorySupport{true, granularity};
  }
  absl::StatusOr<std::uintptr_t> AddressReserve(std::size_t bytes, std::size_t alignment) override {
    if (!Vmm().status.ok()) return Vmm().status;
    (void)cudaFree(nullptr);  // the driver's calls need the current device's primary context: make sure it exists
    CUdeviceptr address = 0;
    absl::Status status = CheckDriver(Vmm().address_reserve(&address, bytes, alignment, 0, 0),
                                      absl::StrCat("cuMemAddressReserve(", bytes, ")"));
    if (!status.ok()) return status;
    return static_cast<std::uintptr_t>(address);
  }
  absl::Status AddressFree(std::uintptr_t address, std::size_t bytes) override {
    if (!Vmm().status.ok()) return Vmm().status;
    return CheckDriver(Vmm().address_free(address, bytes), "cuMemAddressFree");
  }
  absl::StatusOr<PhysicalHandle> PhysicalCreate(std::size_t bytes, int device) override {
    if (!Vmm().status.ok()) return Vmm().status;
    const CUmemAllocationProp prop = DeviceProp(device);
    CUmemGenericAllocationHandle handle = 0;
    absl::Status status = CheckDriver(Vmm().create(&handle, bytes, &prop, 0), absl::StrCat("cuMemCreate(", bytes, ")"));
    if (!status.ok()) return status;
    return static_cast<PhysicalHandle>(handle);
  }
  absl::Status PhysicalRelease(PhysicalHandle handle) override {
    if (!Vmm().status.ok()) return Vmm().status;
    return CheckDriver(Vmm().release(handle), "cuMemRelease");
  }
  absl::Status MapPhysical(std::uintptr_t address, std::size_t bytes, PhysicalHandle handle) override {
    if (!Vmm().status.ok()) return Vmm().status;
    return CheckDriver(Vmm().map(address, bytes, 0, handle, 0), absl::StrCat("cuMemMap(", bytes, ")"));
  }
  absl::Status SetAccess(std::uintptr_t address, std::size_t bytes, int device) override {
    if (!Vmm().status.ok()) return Vmm().status;
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CheckDriver(Vmm().set_access(address, bytes, &access, 1), "cuMemSetAccess");
  }
  absl::Status UnmapPhysical(std::uintptr_t address, std::size_t bytes) override {
    if (!Vmm().status.ok()) return Vmm().status;
    return CheckDriver(Vmm().unmap(address, bytes), "cuMemUnmap");
  }
};

}  // namespace

CudaRuntime* RealCudaRuntime() {
  static auto* runtime = new Cudart();
  return runtime;
}

}  // namespace remat::cuda
