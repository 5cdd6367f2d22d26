// CudaStitchProvider: the stitching arena's memory on a CUDA device (issue 18; memory_provider.h, "Stitching"),
// over the CudaRuntime seam's virtual memory calls (the driver's cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap). Never run on a GPU: tested on the runtime's double (tests/cuda/).
//
// Contract:
//   - Segments are reserved address space only (AddressReserve, aligned to at least the granule); no memory.
//   - The physical pool is at most `physical_bytes / granule` handles of one granule each, created on the device
//     as they are first needed (PhysicalCreate) and kept until the provider dies. Map backs each granule of a range
//     with a handle: MapPhysical, then SetAccess (read-write for the device) before the range is handed out.
//   - Unmap does not unmap: the granules stay mapped and become reusable ("cached"), so a block placed there again
//     costs no driver call. Map takes a cached granule's handle (UnmapPhysical there, then maps it where asked) only
//     when no free or new handle is left. Kernels may still be running on a freed block (in one-stream mode the
//     device arena returns blocks at once, relying on stream order), so before unmapping a cached granule the host
//     waits for the device (DeviceSynchronize), once for every granule freed before that wait.
//   - Release of a segment (the arena emptied) waits for the device, unmaps its granules, returns their handles to
//     the pool and frees the address range. The destructor releases every handle.
//   - Errors name the provider, the device and the range: ResourceExhausted when the device has no memory for a new
//     handle and nothing is cached, the driver's error otherwise (the arena then fails the allocation with it).
// Thread-safe (one mutex); the arena calls Map and Unmap under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "allocator/cuda/cuda_runtime.h"
#include "allocator/memory_provider.h"

namespace remat::cuda {

struct StitchCounters {
  std::uint64_t handles_created = 0;   // PhysicalCreate calls that succeeded
  std::uint64_t maps = 0;              // granules mapped (MapPhysical + SetAccess)
  std::uint64_t cache_hits = 0;        // granules found still mapped where asked (no driver call)
  std::uint64_t steals = 0;            // cached granules unmapped to back another range
  std::uint64_t synchronizations = 0;  // DeviceSynchronize before a steal or a release
};

class CudaStitchProvider : public MemoryProvider {
 public:
  virtual StitchCounters counters() const = 0;
  virtual std::size_t granule() const = 0;
};

// `granule`: a power of two and a multiple of the device's granularity (VirtualMemory). `physical_bytes`: at least
// one granule. InvalidArgument otherwise; FailedPrecondition when the device does not support virtual memory
// management. `runtime` is not owned and must outlive the provider.
absl::StatusOr<std::unique_ptr<CudaStitchProvider>> MakeCudaStitchProvider(CudaRuntime* runtime, int device,
                                                                           std::size_t physical_bytes,
                                                                           std::size_t granule);

}  // namespace remat::cuda
