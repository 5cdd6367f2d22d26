// The memory history (integration/memory_events.h) as torch's CUDA trace entries: what RematCudaAllocator::snapshot
// returns in SnapshotInfo::device_traces, so that torch.cuda.memory._record_memory_history, _snapshot and
// _dump_snapshot work with remat's CUDA allocator and memory_viz shows remat's events.
//
// Per CUDA device (events whose device is >= 0): kAlloc -> ALLOC; kFree -> FREE_REQUESTED then FREE_COMPLETED
// (remat records a free when it is requested; a stream-ordered free may complete later); kMove -> a free at the old
// address and an alloc at the new one; kOutOfMemory -> OOM (addr_ = free bytes); kEvict, kRelease,
// kRematerialize, kPageOut, kPageIn -> ANNOTATE on the block's address with user_metadata "remat_<kind> storage
// <n>" and remat's context (" in: aten::mm > remat: evict"). Times are microseconds since the history started.
// No Python frames (the context recorder torch passes is not called).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <vector>

#include "integration/memory_events.h"

namespace remat::integration {

std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> CudaDeviceTraces(const MemoryHistory& history,
                                                                                   std::size_t device_count);

}  // namespace remat::integration
