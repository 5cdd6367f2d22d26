// CUDA memory providers for the arena (DESIGN.md, "allocator/": cuda), over the CudaRuntime seam.
//
//   MakeCudaDeviceProvider(runtime, device)  segments are cudaMalloc'd on `device` (the calling thread's current
//                                            device is switched for the call and restored). A segment's base is
//                                            aligned to the requested alignment: cudaMalloc guarantees 256 bytes,
//                                            so a larger alignment over-allocates by the difference and trims.
//   MakePinnedHostProvider(runtime)          segments are page-locked host memory from cudaHostAlloc, the second
//                                            tier that paging copies to and from (pinned_host_pool.h).
//
// Both follow MemoryProvider's contract: Reserve fails with the runtime's error (ResourceExhausted for out of
// memory) prefixed with the provider's name and the size; Release of anything Reserve did not return aborts.
// `runtime` is not owned and must outlive the provider.
#pragma once

#include <memory>

#include "allocator/cuda/cuda_runtime.h"
#include "allocator/memory_provider.h"

namespace remat::cuda {

std::unique_ptr<MemoryProvider> MakeCudaDeviceProvider(CudaRuntime* runtime, int device);
std::unique_ptr<MemoryProvider> MakePinnedHostProvider(CudaRuntime* runtime);

}  // namespace remat::cuda
