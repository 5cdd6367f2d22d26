// The C entry points of libremat_cuda.so (DESIGN.md, "PyTorch integration": CUDA).
//
// 1. remat_install_cuda_allocator: makes remat PyTorch's CUDA allocator (the full c10 interface: stats,
//    empty_cache, record_stream, ...). Call it through ctypes after `import torch` and before CUDA initializes:
//        lib = ctypes.CDLL(path); err = ctypes.create_string_buffer(1024)
//        lib.remat_install_cuda_allocator(b"6GiB", None, None, err, 1024)  # 0 on success, else err holds the message
//    `budget` is bytes with a unit or a fraction of device memory ("0.5"); NULL or "" reads REMAT_BUDGET.
//    `host_budget` (pinned host memory for paging) NULL or "" reads REMAT_HOST_BUDGET (unset: no paging).
//    `arena` "contiguous" (one cudaMalloc'd segment per device), "stitch" or "stitch:SIZE" (physical granules mapped
//    into contiguous address ranges where the device supports virtual memory management; issue 18); NULL or ""
//    reads REMAT_ARENA, else contiguous. Malformed: 3. (The pluggable path below reads REMAT_ARENA too.)
//    A failure returns the absl::StatusCode number, never 0: 3 for a malformed or missing budget, 6 when one is
//    already installed, 9 when CUDA was already initialized or there is no CUDA device, 13 for other errors.
//    Nothing is installed on failure. remat.install_cuda_allocator() (integration/python/remat/cuda.py) wraps it.
//    remat_cuda_torch_version() is the torch "major.minor" the library was compiled against (it only works with
//    that one).
//
// 1b. remat_cuda_set_pressure_handler(device, handler): the hook through which the runtime evicts when a CUDA
//    allocation on `device` does not fit in the budget. `handler` is a remat::PressureHandler* (allocator/arena.h;
//    nullptr removes it); its MakeRoom(arena, bytes) is called with the device's Arena after pending stream-ordered
//    frees are exhausted, may free blocks (by freeing the tensors' memory), and returns whether it freed anything.
//    Returns 0, or the absl::StatusCode number with the message in `error` (no allocator installed: 9; invalid
//    device: 13). The handler is not owned and must outlive its use. While remat's engine runs (1c) it is the
//    handler: setting another is FailedPrecondition (9), and so is switching the engine on over a handler set here.
//
// 1c. remat_cuda_enable_engine(device, policy, costs, offload, host_budget, error, error_size): switches remat's
//    engine on over `device`'s
//    arena of the installed allocator (EnableRematEngineOn with CudaDeviceMemory; the engine and its session live in
//    libremat_torch.so, which this library links against): the ops of the calling thread, and the backward passes
//    it starts, are tracked, and a CUDA allocation that does not fit makes room by evicting storages the engine can
//    recompute, rematerialized bitwise when read. `policy` NULL or "" reads REMAT_POLICY (else dtr-eq); `costs` is
//    "measured" (NULL or "") or "estimated"; `offload` ("off", "auto",
//    "always"; NULL or "" reads REMAT_OFFLOAD, else off) and `host_budget` (bytes with a unit; NULL or "" reads
//    REMAT_HOST_BUDGET, else unlimited) page victims to host memory instead of dropping them, through a pinned
//    staging block, with the link model at 12 GB/s and 10 us per copy. Reserves the device's budget now. Returns 0, or the absl::StatusCode number with the message in `error`: 3 for an
//    unknown policy or costs or a device that is not valid (negative, or not below the device count: the message
//    names it), 6 when remat is already enabled on the CPU or the engine already runs on that device, 9 when no
//    allocator is installed. `device` -1 is the calling thread's current device (cudaGetDevice: with torchrun and
//    DDP, the rank's device once the process has selected it). Called again with another device, it adds an engine
//    for that device (one per device, each over its own arena and budget; ops go to the engine of the device their
//    tensors are on: integration/device_router.h). remat.disable() (or remat_cuda_disable_engine) switches them all
//    off.
//    remat_cuda_disable_engine(error, error_size): DisableRematEngine; 0 or the status code (9: not enabled; 8:
//    the tensors still held do not fit the budget once they are all brought back).
//
// 2. The functions torch.cuda.memory.CUDAPluggableAllocator loads (torch 2.14 signatures):
//        void* remat_malloc(size_t size, int device, cudaStream_t stream)
//        void  remat_free(void* ptr, size_t size, int device, cudaStream_t stream)
//    and the optional hooks of torch's C++ CUDAPluggableAllocator (set_init_fn, set_reset_fn,
//    set_memory_fraction_fn, set_base_alloc_fn, set_record_stream_fn):
//        void  remat_init(int device_count)
//        void  remat_reset(void)                                  (empty_cache)
//        void  remat_set_memory_fraction(double fraction, int device)
//        void* remat_base_alloc(void* ptr, size_t* size)
//        void  remat_record_stream(void* ptr, cudaStream_t stream)
//    They serve from the installed remat allocator if there is one, else from one made at the first call with
//    the budget from REMAT_BUDGET (required). Through the pluggable path torch's memory statistics are not
//    available (torch's pluggable wrapper does not forward them); install with (1) to have them.
//    Out of budget, remat_malloc throws c10::OutOfMemoryError as a C++ exception, which torch's wrapper lets
//    through to Python as torch.OutOfMemoryError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" {

int remat_install_cuda_allocator(const char* budget, const char* host_budget, const char* arena, char* error,
                                 std::size_t error_size);
const char* remat_cuda_torch_version();
int remat_cuda_set_pressure_handler(int device, void* handler, char* error, std::size_t error_size);
int remat_cuda_enable_engine(int device, const char* policy, const char* costs, const char* offload,
                             const char* host_budget, char* error, std::size_t error_size);
int remat_cuda_disable_engine(char* error, std::size_t error_size);
void* remat_malloc(std::size_t size, int device, cudaStream_t stream);
void remat_free(void* ptr, std::size_t size, int device, cudaStream_t stream);
void remat_init(int device_count);
void remat_reset();
void remat_set_memory_fraction(double fraction, int device);
void* remat_base_alloc(void* ptr, std::size_t* size);
void remat_record_stream(void* ptr, cudaStream_t stream);

}  // extern "C"
