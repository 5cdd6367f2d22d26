// CudaDeviceMemory: DeviceMemory (integration/device_memory.h) over one CUDA device's arena of remat's CUDA
// allocator (cuda_allocator.h), so that the engine evicts and rematerializes CUDA tensors (EnableRematEngineOn).
//
// Storages come from `storage_allocator` (in production the RematCudaAllocator itself, installed as c10's CUDA
// allocator), so that a request that does not fit reaches the engine through the device arena's pressure handler.
// Blocks remat moves are allocated with DeviceArena::TryAllocate on the device's current stream and slid with
// DeviceArena::Move; copies are cudaMemcpyAsync on the current stream through the CudaRuntime seam, ordered after the
// work of the streams the device blocks involved were allocated on (an event the current stream waits for); a copy
// to or from host memory is then waited for (stream synchronize), a device-to-device copy is left to stream order. Every allocation and
// copy runs with `device` current, whichever device the calling thread had selected. Everything CUDA goes through that seam, so this class runs in CI against the runtime's test
// double, whose "device memory" is host memory: the tests make CPU tensors over it (`tensor_device` CPU) so that
// real kernels run on it.
//
// Paging (offload) is asynchronous (DevicePager, device_memory.h): page-outs copy on the pager's copy stream
// (allocator/cuda/pager.h) into pinned host memory from a PinnedHostPool (an arena: blocks rounded to 512 bytes, not
// to powers of two), after an event recorded on the current stream (the producing kernel); the freed device block
// goes back to the arena only after the copy's event, and the allocating stream waits for that event on the device
// (DeviceArena's stream-ordered reuse). Page-ins copy back on the copy stream after the current stream's queued work;
// the kernel that reads the bytes is ordered after the copy by cudaStreamWaitEvent on its stream (WaitForPageIn),
// never by the host waiting. The pool and pager are remat's CUDA allocator's for the device when it has a host budget
// (CudaAllocatorOptions::host_budget), else this object's own (no budget of their own: the engine's host budget
// bounds what is paged). CopyToHost/CopyFromHost (synchronous, through a pinned staging block) remain for callers
// that page without a pager.
// Not done on CUDA yet: reproducing random ops (the dispatch hook captures only the CPU generator: outputs of CUDA
// random ops are kept as constants).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "integration/cuda/cuda_allocator.h"
#include "integration/device_memory.h"

namespace remat::integration {

// The engine's link model for paging on CUDA (the drop-or-page choice of offload "auto" and its stall figures):
// 12 GB/s, as measured between a V100 and pinned host memory (DESIGN.md, "Offloading"), and 10 us per copy.
inline constexpr double kCudaLinkBandwidthBytesPerS = 12e9;
inline constexpr std::int64_t kCudaLinkLatencyNs = 10'000;

class CudaDeviceMemory final : public DeviceMemory, private DevicePager {
 public:
  // Reserves the device's budget now (the engine needs its arena from the start). `allocator` is not owned and
  // must outlive this object; `storage_allocator` (not owned) makes NewStorage's storages; `tensor_device` is the
  // device type of those storages (CUDA in production).
  static absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> Create(RematCudaAllocator* allocator,
                                                                  c10::DeviceIndex device,
                                                                  c10::Allocator* storage_allocator,
                                                                  c10::DeviceType tensor_device);
  // Production: remat's installed CUDA allocator for `device` and CUDA tensors. FailedPrecondition when remat's CUDA
  // allocator is not installed.
  static absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> ForInstalledAllocator(c10::DeviceIndex device);

  ~CudaDeviceMemory() override;
  c10::DeviceType device_type() const override { return tensor_device_; }
  Arena* arena() override { return arena_; }
  bool Owns(const c10::DataPtr& data) const override;
  bool Borrowed(const c10::DataPtr& data) const override;
  c10::intrusive_ptr<c10::StorageImpl> NewStorage(std::size_t nbytes) override;
  c10::DataPtr TryAllocate(std::size_t bytes, Placement placement) override;
  absl::Status Slide(c10::StorageImpl& storage, std::uintptr_t to) override;
  void SetPressureHandler(PressureHandler* handler) override;
  void SetPlacementForThisThread(Placement placement) override;
  std::size_t alignment() const override;
  absl::Status Copy(void* dst, const void* src, std::size_t nbytes) override;
  absl::Status CopyToHost(void* host, const void* src, std::size_t nbytes) override;
  absl::Status CopyFromHost(void* dst, const void* host, std::size_t nbytes) override;
  bool host_accessible() const override { return false; }
  DevicePager* pager() override { return this; }
  std::int16_t history_device() const override { return device_; }
  bool OnThisDevice(c10::StorageImpl& storage) const override;
  int CurrentDevice() const override;
  absl::Status SetCurrentDevice(int device) override;

 private:
  CudaDeviceMemory(RematCudaAllocator* allocator, c10::DeviceIndex device, Arena* arena,
                   c10::Allocator* storage_allocator, c10::DeviceType tensor_device);
  // DevicePager (above).
  absl::StatusOr<Page> PageOut(const void* src, std::size_t nbytes) override;
  absl::Status PageIn(Page page, void* dst) override;
  absl::Status WaitForPageIn(Page page) override;
  absl::Status Release(Page page) override;
  absl::StatusOr<cuda::CudaPager*> Pager();  // created at the first page-out

  absl::Status CopyAndWait(void* dst, const void* src, std::size_t nbytes, cuda::CopyKind kind);
  absl::Status EnsureStaging(std::size_t nbytes);
  c10::Device DataPtrDevice() const;

  RematCudaAllocator* allocator_;
  c10::DeviceIndex device_;
  Arena* arena_;
  c10::Allocator* storage_allocator_;
  c10::DeviceType tensor_device_;
  void* staging_ = nullptr;  // pinned host memory for CopyToHost/CopyFromHost
  std::size_t staging_bytes_ = 0;
  cuda::CudaPager* pager_ = nullptr;                   // the allocator's, or own_pager_
  std::unique_ptr<cuda::PinnedHostPool> own_pool_;    // when the allocator has no host budget
  std::unique_ptr<cuda::CudaPager> own_pager_;
};

}  // namespace remat::integration
