// GranuleMap: which granules of an arena's address space hold physical memory, when the arena stitches
// (ArenaOptions::granule): a granule is mapped exactly while some allocated block overlaps it, and the budget
// counts mapped granules, not allocated bytes. A block that fully covers a granule is its only user; a granule
// that blocks cover in part (a block's first or last granule, or a small block inside one) counts its users.
// So each block's bookkeeping is O(1) hash operations whatever its size, and its interior granules form one
// contiguous range mapped or unmapped at once.
//
// Not thread-safe: the arena calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace remat {

// A run of whole granules, [address, address + bytes).
struct GranuleRange {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
};

class GranuleMap {
 public:
  // `granule`: a power of two. `limit`: the most bytes that may be mapped at once (the physical budget).
  GranuleMap(std::size_t granule, std::size_t limit) : granule_(granule), limit_(limit) {}

  // Granules that [address, address + size) would newly map if it became allocated.
  std::size_t NewGranules(std::uintptr_t address, std::size_t size) const;
  // Whether it may become allocated without passing the limit.
  bool Fits(std::uintptr_t address, std::size_t size) const {
    return (mapped_ + NewGranules(address, size)) * granule_ <= limit_;
  }
  // The smallest number of granules a block of `size` bytes can need (its size in granules, rounded up).
  std::size_t MinGranules(std::size_t size) const { return (size + granule_ - 1) / granule_; }
  // Records an allocated block; appends the granules it maps to `mapped` (in address order).
  void Add(std::uintptr_t address, std::size_t size, std::vector<GranuleRange>* mapped);
  // Forgets an allocated block; appends the granules nothing overlaps any more to `unmapped`.
  void Remove(std::uintptr_t address, std::size_t size, std::vector<GranuleRange>* unmapped);

  std::size_t granule() const { return granule_; }
  std::size_t limit() const { return limit_; }
  std::size_t mapped_bytes() const { return mapped_ * granule_; }
  std::size_t peak_bytes() const { return peak_ * granule_; }
  void ResetPeak() { peak_ = mapped_; }

 private:
  // The granules [first, last] a block touches, and whether its first and last are only partly covered.
  struct Span {
    std::uintptr_t first, last;  // granule indices
    bool first_partial, last_partial;
  };
  Span SpanOf(std::uintptr_t address, std::size_t size) const;
  // Whole granules strictly covered by the block (those not partial).
  static std::size_t WholeCount(const Span& s);

  std::size_t granule_;
  std::size_t limit_;
  std::size_t mapped_ = 0;  // granules
  std::size_t peak_ = 0;
  absl::flat_hash_map<std::uintptr_t, std::uint32_t> partial_users_;  // granule index -> blocks covering it in part
};

}  // namespace remat
