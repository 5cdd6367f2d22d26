// An arena's blocks as torch's snapshot segments (c10::CachingDeviceAllocator::SegmentInfo): what
// torch.cuda.memory_snapshot() and memory_viz show of remat's CUDA arenas (RematCudaAllocator::snapshot).
//
// A contiguous arena is one segment of all its blocks. A stitching arena (issue 18) holds memory only in the
// granules its allocated blocks overlap: its segments are the runs of such granules, each with the blocks inside it
// (free blocks cut at the run's ends), so the segments add up to the physical memory mapped rather than to the
// address space reserved (eight times the budget). Every block is reported as requested at its full size.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <vector>

#include "allocator/arena.h"

namespace remat::integration {

// `blocks` in address order (Arena::ForEachBlock); `granule` 0 for a contiguous arena. Empty for no blocks.
std::vector<c10::CachingDeviceAllocator::SegmentInfo> SnapshotSegments(const std::vector<BlockInfo>& blocks,
                                                                       std::size_t granule, c10::DeviceIndex device);

}  // namespace remat::integration
