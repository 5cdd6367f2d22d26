// A StorageView over plain vectors, for policy tests.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/policy.h"

namespace remat {

struct FakeStorage {
  std::int64_t bytes = 100;
  std::int64_t compute = 10;
  std::int64_t last_access = 0;
  std::int64_t region = 0;     // forward + backward evicted regions
  std::int64_t ancestors = 0;  // backward only
  std::int64_t eq = 0;
  std::int64_t neighbours = 0;
  std::int64_t adjacent_free = 0;
  bool evictable = true;
  bool costly = false;
};

class FakeView : public StorageView {
 public:
  std::int64_t clock = 100;
  std::vector<FakeStorage> s;
  std::int64_t Clock() const override { return clock; }
  std::int64_t Bytes(StorageId i) const override { return s[i].bytes; }
  std::int64_t Compute(StorageId i) const override { return s[i].compute; }
  std::int64_t LastAccess(StorageId i) const override { return s[i].last_access; }
  bool Evictable(StorageId i) const override { return s[i].evictable; }
  std::int64_t RegionCompute(StorageId i) const override { return s[i].region; }
  std::int64_t AncestorCompute(StorageId i) const override { return s[i].ancestors; }
  std::int64_t EqClassCompute(StorageId i) const override { return s[i].eq; }
  std::int64_t EvictedNeighbourCompute(StorageId i) const override { return s[i].neighbours; }
  std::int64_t AdjacentFreeBytes(StorageId i) const override { return s[i].adjacent_free; }
  bool Costly(StorageId i) const override { return s[i].costly; }
};

}  // namespace remat
