// Test fixture: remat's CUDA allocator over the CUDA runtime's test double, with real CPU kernels on its "device
// memory" (host memory), for the tests of the engine on CUDA devices (cuda_engine_test.cc, cuda_engine_devices_test.cc).
//
// While a FakeDevice lives, c10's CPU allocator is a FakeDeviceAllocator: every CPU tensor's memory is a block of the
// CUDA allocator's arena of the double's current device (the calling thread's, cudaSetDevice: 0 unless a test or
// remat's device router selects another), allocated on the stream the test calls current. That is how an op "runs on a
// device" here: the kernels are the CPU's, their allocations go to the device made current, as a CUDA kernel's device
// guard would put them on its tensors' device.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/cuda/cuda_allocator.h"
#include "integration/cuda/cuda_device_memory.h"
#include "integration/engine_session.h"
#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::integration {

// c10's CPU allocator for the test: blocks of the CUDA allocator's arena of the double's current device.
class FakeDeviceAllocator final : public c10::Allocator {
 public:
  FakeDeviceAllocator(RematCudaAllocator* cuda, const cudaStream_t* current) : cuda_(cuda), current_(current) {}
  c10::DataPtr allocate(std::size_t bytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (bytes == 0) return c10::DataPtr(nullptr, nullptr, cuda_->raw_deleter(), cpu);
    const absl::StatusOr<int> device = cuda_->runtime()->GetDevice();
    TORCH_CHECK(device.ok(), "fake device: ", device.status().message());
    void* pointer = cuda_->Malloc(bytes, static_cast<c10::DeviceIndex>(*device), *current_);
    return c10::DataPtr(pointer, pointer, cuda_->raw_deleter(), cpu);
  }
  c10::DeleterFnPtr raw_deleter() const override { return cuda_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  RematCudaAllocator* cuda_;
  const cudaStream_t* current_;
};

// A CUDA allocator over the double with a budget per device (the same for all unless SetBudget changes one),
// installed (for CPU tensors) as c10's CPU allocator while it lives.
struct FakeDevice {
  // `stitch_granule` > 0: the device supports virtual memory at that granularity and the arena stitches (issue 18).
  explicit FakeDevice(std::size_t budget, int devices = 1, std::size_t stitch_granule = 0)
      : rt(cuda::FakeCudaOptions{devices, std::size_t{64} << 20, true,
                                 stitch_granule > 0 ? stitch_granule : std::size_t{2} << 20}) {
    CudaAllocatorOptions options;
    options.budget = budget;
    if (stitch_granule > 0) {
      options.arena = cuda::DeviceArenaKind::kStitch;
      options.stitch_granule = stitch_granule;
    }
    CudaStreams streams;
    streams.current = [this](c10::DeviceIndex) { return current; };
    streams.handle = [](const c10::cuda::CUDAStream&) -> cudaStream_t { return nullptr; };
    cuda = std::make_unique<RematCudaAllocator>(&rt, options, std::move(streams));
    host = std::make_unique<FakeDeviceAllocator>(cuda.get(), &current);
    previous = c10::GetCPUAllocator();
    c10::SetCPUAllocator(host.get(), kPriority);
  }
  ~FakeDevice() {
    if (RematEngineEnabled()) (void)DisableRematEngine();  // a failed assertion left it on
    c10::SetCPUAllocator(previous, kPriority);
    (void)rt.SetDevice(0);
  }

  // The engine on `device`'s arena (EnableRematEngineOn; a second device adds an engine).
  absl::Status Enable(const std::string& policy, OffloadMode offload = OffloadMode::kOff, int device = 0) {
    absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
        CudaDeviceMemory::Create(cuda.get(), static_cast<c10::DeviceIndex>(device), host.get(), c10::DeviceType::CPU);
    if (!memory.ok()) return memory.status();
    EngineSessionOptions options;
    options.budget = budget(device);
    options.policy = policy;
    options.costs = "estimated";
    options.offload = offload;
    options.bandwidth_bytes_per_s = kCudaLinkBandwidthBytesPerS;
    options.latency_ns = kCudaLinkLatencyNs;
    return EnableRematEngineOn(options, *std::move(memory));
  }
  // Makes `device` the calling thread's current device: CPU tensors made from now on live there.
  void Use(int device) { TORCH_CHECK(rt.SetDevice(device).ok(), "fake device: no device ", device); }
  // Changes one device's budget (before anything is allocated on it).
  absl::Status SetBudget(int device, std::size_t bytes) {
    return cuda->Device(static_cast<c10::DeviceIndex>(device)).SetBudget(bytes);
  }
  std::size_t budget(int device = 0) { return *cuda->Device(static_cast<c10::DeviceIndex>(device)).Budget(); }
  cuda::DeviceArenaStats Stats(int device = 0) { return cuda->Device(static_cast<c10::DeviceIndex>(device)).Stats(); }

  static constexpr std::uint8_t kPriority = 200;  // above whatever the process installed
  cuda::FakeCudaRuntime rt;
  cudaStream_t current = nullptr;
  std::unique_ptr<RematCudaAllocator> cuda;
  std::unique_ptr<FakeDeviceAllocator> host;
  c10::Allocator* previous = nullptr;
};

}  // namespace remat::integration
