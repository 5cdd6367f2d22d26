// SnapshotSegments: see cuda_snapshot.h.
#include "integration/cuda/cuda_snapshot.h"

#include <algorithm>
#include <utility>

namespace remat::integration {
namespace {

// A snapshot segment (what torch.cuda.memory_snapshot and memory_viz show) of blocks in address order.
c10::CachingDeviceAllocator::SegmentInfo SegmentOf(const std::vector<BlockInfo>& blocks, c10::DeviceIndex device) {
  c10::CachingDeviceAllocator::SegmentInfo segment;
  segment.device = device;
  segment.address = blocks.front().address;
  segment.is_large = true;
  for (const BlockInfo& block : blocks) {
    segment.total_size += block.size;
    c10::CachingDeviceAllocator::BlockInfo out;
    out.size = block.size;
    out.requested_size = block.size;
    out.allocated = !block.free;
    out.active = !block.free;
    if (!block.free) {
      segment.allocated_size += block.size;
      segment.active_size += block.size;
      segment.requested_size += block.size;
    }
    segment.blocks.push_back(std::move(out));
  }
  return segment;
}

// The runs of granules allocated blocks overlap, each with the blocks inside it (free blocks cut at its ends).
std::vector<std::vector<BlockInfo>> MappedRuns(const std::vector<BlockInfo>& blocks, std::size_t granule) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> runs;  // [start, end), granule-aligned, in order
  for (const BlockInfo& block : blocks) {
    if (block.free) continue;
    const std::uintptr_t start = block.address / granule * granule;
    const std::uintptr_t end = (block.address + block.size + granule - 1) / granule * granule;
    if (!runs.empty() && start <= runs.back().second) {
      runs.back().second = std::max(runs.back().second, end);
    } else {
      runs.emplace_back(start, end);
    }
  }
  std::vector<std::vector<BlockInfo>> out;
  std::size_t next = 0;
  for (const auto& [start, end] : runs) {
    std::vector<BlockInfo> run;
    while (next < blocks.size() && blocks[next].address + blocks[next].size <= start) ++next;
    for (std::size_t i = next; i < blocks.size() && blocks[i].address < end; ++i) {
      BlockInfo part = blocks[i];
      const std::uintptr_t lo = std::max(part.address, start);
      const std::uintptr_t hi = std::min(part.address + part.size, end);
      part.address = lo;
      part.size = hi - lo;
      run.push_back(part);
    }
    out.push_back(std::move(run));
  }
  return out;
}

}  // namespace

std::vector<c10::CachingDeviceAllocator::SegmentInfo> SnapshotSegments(const std::vector<BlockInfo>& blocks,
                                                                       std::size_t granule, c10::DeviceIndex device) {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments;
  if (blocks.empty()) return segments;
  if (granule == 0) {
    segments.push_back(SegmentOf(blocks, device));
    return segments;
  }
  for (const std::vector<BlockInfo>& run : MappedRuns(blocks, granule)) segments.push_back(SegmentOf(run, device));
  return segments;
}

}  // namespace remat::integration
