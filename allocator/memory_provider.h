// MemoryProvider: where an arena's segments come from.
//
// Contract: Reserve returns a segment of at least `bytes` whose base is aligned to `alignment` (a power of two),
// or an error that names the provider and the size; Release gives back exactly a segment Reserve returned.
// Providers never look inside segments: all placement logic lives in the arena.
//
// Stitching (ArenaOptions::granule): the arena's segments are address space only, and the arena asks for physical
// memory granule by granule: Map backs [address, address + bytes) (whole granules inside a segment) with memory,
// Unmap gives it back (the contents are lost). A provider that backs its segments fully (host, CUDA) or backs
// nothing (virtual) accepts both as no-ops; a stitching provider (allocator/stitch_host_provider.cc) backs granules
// with memory there, never more than its pool's worth at once.
//
// Five providers exist:
//   virtual      addresses only, no memory behind them (trace replay); segments come from a private address range
//   host         aligned host memory (the CPU path)
//   stitch       address space, backed granule by granule with private memory (the CPU path with a stitching arena)
//   cuda         cudaMalloc'd device segments (allocator/cuda/, compiled with nvcc)
//   cuda stitch  reserved device address space, backed by cuMemCreate'd granules (allocator/cuda/cuda_stitch_provider.h)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

namespace remat {

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
};

class MemoryProvider {
 public:
  virtual ~MemoryProvider() = default;
  virtual absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) = 0;
  virtual void Release(const Segment& segment) = 0;
  // True when addresses point to real memory the caller may read and write.
  virtual bool BacksMemory() const = 0;
  // Stitching (above). An error (the physical pool is exhausted, a failed mapping) names the provider and the range.
  virtual absl::Status Map(std::uintptr_t address, std::size_t bytes) {
    (void)address;
    (void)bytes;
    return absl::OkStatus();
  }
  virtual void Unmap(std::uintptr_t address, std::size_t bytes) {
    (void)address;
    (void)bytes;
  }
  virtual std::string_view Name() const = 0;
};

std::unique_ptr<MemoryProvider> MakeVirtualProvider();
std::unique_ptr<MemoryProvider> MakeHostProvider();
// Stitching on the CPU (allocator/stitch_host_provider.cc): address-space segments whose granules Map backs with
// private memory, at most `physical_bytes` (rounded down to the granule) at once. `granule`: a power of two
// and a multiple of the page size. InvalidArgument for a bad granule or pool size; the system's error otherwise.
absl::StatusOr<std::unique_ptr<MemoryProvider>> MakeStitchHostProvider(std::size_t physical_bytes,
                                                                       std::size_t granule);

}  // namespace remat
