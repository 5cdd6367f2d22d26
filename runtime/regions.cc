#include "runtime/regions.h"

#include <algorithm>

namespace remat {

std::uint32_t RegionWalker::NextStamp(std::size_t storages) {
  if (mark_.size() < storages) mark_.resize(storages + storages / 2 + 16, 0);
  if (++stamp_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    stamp_ = 1;
  }
  return stamp_;
}

void RegionWalker::Absorb(Region& region, const Region& other, StorageIndex s, std::span<const std::int64_t> costs) {
  std::uint32_t st = NextStamp(costs.size());
  for (std::size_t i = 0; i < region.frontier.size();) {
    if (region.frontier[i] == s) {
      region.frontier[i] = region.frontier.back();
      region.frontier.pop_back();
    } else {
      mark_[region.frontier[i++]] = st;
    }
  }
  for (StorageIndex f : other.frontier) {
    if (f != s && mark_[f] != st) {
      mark_[f] = st;
      region.frontier.push_back(f);
    }
  }
  st = NextStamp(costs.size());
  for (StorageIndex i : region.interior) mark_[i] = st;
  std::int64_t added = costs[s];  // the prototype adds s's cost even if s was already inside
  if (mark_[s] != st) {
    mark_[s] = st;
    region.interior.push_back(s);
  }
  for (StorageIndex i : other.interior) {
    if (mark_[i] != st) {
      mark_[i] = st;
      region.interior.push_back(i);
      added += costs[i];
    }
  }
  region.compute += added;
}

void RegionWalker::Rebuild(Region& region, StorageIndex base, const std::vector<std::vector<StorageIndex>>& adjacency,
                           std::span<const std::uint8_t> state, std::span<const std::int64_t> costs) {
  region.Clear();
  // Interior and frontier are disjoint (resident or not), so one stamp serves both.
  const std::uint32_t st = NextStamp(costs.size());
  // Raw pointers: the compiler cannot prove these do not alias the region's vectors.
  std::uint32_t* const mk = mark_.data();
  const std::uint8_t* const flags_of = state.data();
  const std::int64_t* const cost_of = costs.data();
  std::int64_t compute = 0;
  dfs_.clear();
  dfs_.push_back(base);
  while (!dfs_.empty()) {
    StorageIndex s = dfs_.back();
    dfs_.pop_back();
    const std::vector<StorageIndex>& next = adjacency[s];
    const StorageIndex* it = next.data();
    const StorageIndex* const end = it + next.size();
    for (; it != end; ++it) {
      const StorageIndex us = *it;
      if (mk[us] == st) continue;
      const std::uint8_t flags = flags_of[us];
      if (flags & kRegionDead) continue;
      if (flags & kRegionMaterial) {
        if (us != base) {
          mk[us] = st;
          region.frontier.push_back(us);
        }
        continue;
      }
      mk[us] = st;
      region.interior.push_back(us);
      compute += cost_of[us];
      dfs_.push_back(us);
    }
  }
  region.compute = compute;
}

}  // namespace remat
