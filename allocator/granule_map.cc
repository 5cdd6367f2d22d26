#include "allocator/granule_map.h"

#include <algorithm>

namespace remat {

GranuleMap::Span GranuleMap::SpanOf(std::uintptr_t address, std::size_t size) const {
  const std::uintptr_t end = address + size;  // size > 0 (the arena never places empty blocks)
  Span s;
  s.first = address / granule_;
  s.last = (end - 1) / granule_;
  s.first_partial = address % granule_ != 0 || (s.first == s.last && end % granule_ != 0);
  s.last_partial = end % granule_ != 0 || (s.first == s.last && address % granule_ != 0);
  return s;
}

std::size_t GranuleMap::WholeCount(const Span& s) {
  if (s.first == s.last) return s.first_partial ? 0 : 1;
  return static_cast<std::size_t>(s.last - s.first + 1) - (s.first_partial ? 1 : 0) - (s.last_partial ? 1 : 0);
}

std::size_t GranuleMap::NewGranules(std::uintptr_t address, std::size_t size) const {
  const Span s = SpanOf(address, size);
  std::size_t n = WholeCount(s);
  if (s.first_partial && !partial_users_.contains(s.first)) ++n;
  if (s.last_partial && s.last != s.first && !partial_users_.contains(s.last)) ++n;
  return n;
}

void GranuleMap::Add(std::uintptr_t address, std::size_t size, std::vector<GranuleRange>* mapped) {
  const Span s = SpanOf(address, size);
  auto use_partial = [&](std::uintptr_t g) {
    if (partial_users_[g]++ == 0) {
      ++mapped_;
      mapped->push_back({g * granule_, granule_});
    }
  };
  if (s.first_partial) use_partial(s.first);
  if (const std::size_t whole = WholeCount(s); whole > 0) {
    const std::uintptr_t begin = s.first_partial ? s.first + 1 : s.first;
    mapped_ += whole;
    mapped->push_back({begin * granule_, whole * granule_});
  }
  if (s.last_partial && s.last != s.first) use_partial(s.last);
  peak_ = std::max(peak_, mapped_);
}

void GranuleMap::Remove(std::uintptr_t address, std::size_t size, std::vector<GranuleRange>* unmapped) {
  const Span s = SpanOf(address, size);
  auto release_partial = [&](std::uintptr_t g) {
    auto it = partial_users_.find(g);
    if (it == partial_users_.end()) return;  // not recorded: nothing to give back
    if (--it->second == 0) {
      partial_users_.erase(it);
      --mapped_;
      unmapped->push_back({g * granule_, granule_});
    }
  };
  if (s.first_partial) release_partial(s.first);
  if (const std::size_t whole = WholeCount(s); whole > 0) {
    const std::uintptr_t begin = s.first_partial ? s.first + 1 : s.first;
    mapped_ -= whole;
    unmapped->push_back({begin * granule_, whole * granule_});
  }
  if (s.last_partial && s.last != s.first) release_partial(s.last);
}

}  // namespace remat
