// NeighbourhoodCosts' contract on small graphs: union-find classes merge evicted neighbours and sum each class once,
// a storage coming back lowers its class, weights are marked dirty by the changes that can alter them and only
// those, regions absorb an evicted storage and are rebuilt around a resident one, compaction keeps the sums.
#include "runtime/neighbourhood_costs.h"

#include <vector>

#include <gtest/gtest.h>

namespace remat {
namespace {

// A chain 0 -> 1 -> 2 -> 3 (each computed from the previous), all resident at first, with a set of evicted slots.
struct Chain {
  explicit Chain(bool regions, bool eq_classes, bool weights) {
    nb.Configure(regions, eq_classes, weights);
    for (int i = 0; i < 4; ++i) {
      nb.AddSlot();
      nb.SetMaterial(i, true);
      nb.AddCompute(i, 10 * (i + 1));
    }
    pool.Grow(4);
    for (StorageIndex c = 1; c < 4; ++c) nb.AddEdge(c, c - 1);
    const StorageIndex all[] = {0, 1, 2, 3};  // as the engine does when storages become resident
    nb.RebuildAround(all, [](StorageIndex) { return false; });
  }
  void Evict(StorageIndex s) {
    evicted[s] = true;
    nb.SetMaterial(s, false);
    nb.AbsorbEvicted(s, [](StorageIndex) { return false; });
    nb.Evicted(s, 10 * (s + 1), pool.size(), [&](StorageIndex n) { return !evicted[n]; });
  }
  std::int64_t EqSum(StorageIndex s) {
    return nb.EqSum(s, [&](StorageIndex n) { return !evicted[n]; });
  }
  NeighbourhoodCosts nb;
  EvictionPool pool;
  bool evicted[4] = {false, false, false, false};
};

TEST(NeighbourhoodCostsTest, EvictedNeighboursMergeIntoOneClassCountedOnce) {
  Chain g(false, true, false);
  g.Evict(1);
  g.Evict(2);  // joins 1's class: value 20 + 30
  EXPECT_EQ(g.EqSum(0), 50);  // 0's only evicted neighbour is 1
  EXPECT_EQ(g.EqSum(3), 50);  // 3's is 2, same class
  g.evicted[1] = false;       // 1 is back: its class loses its 20
  g.nb.SetMaterial(1, true);
  g.nb.Resident(1, 20, g.pool.size());
  EXPECT_EQ(g.EqSum(3), 30);
  EXPECT_EQ(g.EqSum(0), 0);
}

TEST(NeighbourhoodCostsTest, CompactionKeepsEveryClassValue) {
  Chain g(false, true, false);
  g.Evict(1);
  g.Evict(2);
  g.evicted[2] = false;
  g.nb.SetMaterial(2, true);
  g.nb.Resident(2, 30, g.pool.size());
  g.Evict(2);  // a second node for 2
  const std::int64_t before0 = g.EqSum(0), before3 = g.EqSum(3);
  const std::size_t nodes = g.nb.union_find_nodes();
  g.nb.MaybeCompactClasses(0, 1, [](StorageIndex) { return false; });
  EXPECT_LT(g.nb.union_find_nodes(), nodes);
  EXPECT_EQ(g.EqSum(0), before0);
  EXPECT_EQ(g.EqSum(3), before3);
}

TEST(NeighbourhoodCostsTest, RegionsAbsorbAnEvictedStorageAndAreRebuiltAroundAResidentOne) {
  Chain g(true, false, false);
  g.Evict(1);
  g.Evict(2);
  // 0's forward region: 1 and 2 (evicted), frontier 3.
  EXPECT_EQ(g.nb.Forward(0).compute, 20 + 30);
  EXPECT_EQ(g.nb.Backward(3).compute, 20 + 30);
  g.evicted[2] = false;
  g.nb.SetMaterial(2, true);
  const StorageIndex back[] = {2};
  g.nb.RebuildAround(back, [](StorageIndex) { return false; });
  EXPECT_EQ(g.nb.Forward(0).compute, 20);
  EXPECT_EQ(g.nb.Backward(3).compute, 0);
  EXPECT_EQ(g.nb.Backward(2).compute, 20);
}

TEST(NeighbourhoodCostsTest, WeightsAreRecomputedOnlyWhenSomethingTheyReadChanged) {
  Chain g(false, true, true);
  for (StorageIndex s = 0; s < 4; ++s) {
    g.pool.Append(s, 0, false);
    g.nb.JoinedPool(s, 4);
  }
  std::vector<StorageIndex> computed;
  auto weight_of = [&](StorageIndex s) {
    computed.push_back(s);
    return 1.0 * s;
  };
  g.nb.RefreshWeights(g.pool, weight_of);
  EXPECT_EQ(computed.size(), 4u);  // every member joined dirty
  computed.clear();
  g.nb.RefreshWeights(g.pool, weight_of);
  EXPECT_TRUE(computed.empty());  // nothing changed
  g.nb.Touch(3);                  // 3 and its neighbour 2
  g.nb.RefreshWeights(g.pool, weight_of);
  EXPECT_EQ(computed, (std::vector<StorageIndex>{3, 2}));
  computed.clear();
  g.pool.Remove(2);
  g.nb.LeftPool(2);
  g.nb.Touch(2);  // 2 left the pool: only its neighbours 1 and 3 are recomputed
  g.nb.RefreshWeights(g.pool, weight_of);
  EXPECT_EQ(computed, (std::vector<StorageIndex>{1, 3}));
  EXPECT_EQ(g.pool.Weights()[g.pool.Position(3)], 3.0);
}

}  // namespace
}  // namespace remat
