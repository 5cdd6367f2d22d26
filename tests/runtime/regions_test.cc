#include "runtime/regions.h"

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::UnorderedElementsAre;

// Chain 0 -> 1 -> 2 -> 3 -> 4 (children); 1, 2, 3 evicted.
struct Chain {
  std::vector<std::vector<StorageIndex>> children = {{1}, {2}, {3}, {4}, {}};
  std::vector<std::vector<StorageIndex>> parents = {{}, {0}, {1}, {2}, {3}};
  std::vector<std::uint8_t> state = {kRegionMaterial, 0, 0, 0, kRegionMaterial};
  std::vector<std::int64_t> costs = {1, 10, 20, 30, 2};
};

TEST(RegionsTest, RebuildWalksThroughEvictedStoragesToTheResidentFrontier) {
  Chain g;
  RegionWalker w;
  Region fwd0, rev4;
  w.Rebuild(fwd0, 0, g.children, g.state, g.costs);
  EXPECT_THAT(fwd0.interior, UnorderedElementsAre(1, 2, 3));
  EXPECT_THAT(fwd0.frontier, UnorderedElementsAre(4));
  EXPECT_EQ(fwd0.compute, 60);
  w.Rebuild(rev4, 4, g.parents, g.state, g.costs);
  EXPECT_EQ(rev4.compute, 60);
  EXPECT_THAT(rev4.frontier, UnorderedElementsAre(0));
  g.state[2] = kRegionDead;  // dead storages are out of the graph
  w.Rebuild(fwd0, 0, g.children, g.state, g.costs);
  EXPECT_THAT(fwd0.interior, UnorderedElementsAre(1));
  EXPECT_TRUE(fwd0.frontier.empty());
}

TEST(RegionsTest, AbsorbFoldsTheEvictedFrontierStoragesRegion) {
  Chain g;
  g.state[3] = kRegionMaterial;  // 3 resident: fwd(0) = {1, 2}, frontier {3}
  RegionWalker w;
  Region fwd0, fwd3;
  w.Rebuild(fwd0, 0, g.children, g.state, g.costs);
  w.Rebuild(fwd3, 3, g.children, g.state, g.costs);
  ASSERT_EQ(fwd0.compute, 30);
  g.state[3] = 0;  // evict 3: fwd(0) absorbs it
  w.Absorb(fwd0, fwd3, 3, g.costs);
  EXPECT_THAT(fwd0.interior, UnorderedElementsAre(1, 2, 3));
  EXPECT_THAT(fwd0.frontier, UnorderedElementsAre(4));
  EXPECT_EQ(fwd0.compute, 60);
}

}  // namespace
}  // namespace remat
