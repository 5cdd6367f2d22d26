// Regions: the evicted neighbourhoods behind h_DTR and MSPS, maintained exactly as the DTR prototype's simulator
// does (its Region.absorb / Region.rebuild), so that scores and therefore choices match it.
//
// A storage has a forward region (evicted storages reachable through children via evicted storages) and a
// backward one (through parents). interior = those evicted storages, frontier = the resident storages at the edge,
// compute = summed cost of the interior. Rebuild recomputes a region from the graph; Absorb folds an evicted
// frontier storage's own region (same direction) into a region. Both are O(size) with stamped marks (no hashing).
// Storage-level adjacency lists may contain repeats; marks make them harmless.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace remat {

using StorageIndex = std::uint32_t;

struct Region {
  std::vector<StorageIndex> interior;  // unordered
  std::vector<StorageIndex> frontier;  // unordered
  std::int64_t compute = 0;
  void Clear() {
    interior.clear();
    frontier.clear();
    compute = 0;
  }
};

// Per-storage state bits read by the walks.
inline constexpr std::uint8_t kRegionMaterial = 1;  // resident: stops a walk (frontier)
inline constexpr std::uint8_t kRegionDead = 2;      // out of the graph: ignored

class RegionWalker {
 public:
  // region.frontier := (frontier - {s}) | other.frontier - {s};
  // region.interior |= other.interior | {s}; compute += cost(s) + cost(other.interior - interior - {s}).
  void Absorb(Region& region, const Region& other, StorageIndex s, std::span<const std::int64_t> costs);
  // Recomputes `region` of `base` by a walk over `adjacency` (parents for backward, children for forward).
  void Rebuild(Region& region, StorageIndex base, const std::vector<std::vector<StorageIndex>>& adjacency,
               std::span<const std::uint8_t> state, std::span<const std::int64_t> costs);

 private:
  std::uint32_t NextStamp(std::size_t storages);
  std::vector<std::uint32_t> mark_;
  std::uint32_t stamp_ = 0;
  std::vector<StorageIndex> dfs_;
};

}  // namespace remat
