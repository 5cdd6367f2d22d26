// EvictionPool's contract: the list keeps insertion order, the dense arrays hold exactly the members (with their
// sequence numbers giving the list order back), swap-removal keeps positions consistent, and the negative count
// follows what joined.
#include "runtime/eviction_pool.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

namespace remat {
namespace {

std::vector<EvictionPool::Slot> ListOrder(const EvictionPool& pool) {
  std::vector<EvictionPool::Slot> out;
  for (auto s = pool.Head(); s != EvictionPool::kNone; s = pool.Next(s)) out.push_back(s);
  return out;
}

// The dense members ordered by sequence number: the list order, by the contract.
std::vector<EvictionPool::Slot> DenseOrder(const EvictionPool& pool) {
  std::vector<std::size_t> index(pool.size());
  for (std::size_t i = 0; i < index.size(); ++i) index[i] = i;
  std::sort(index.begin(), index.end(),
            [&](std::size_t a, std::size_t b) { return pool.Sequence()[a] < pool.Sequence()[b]; });
  std::vector<EvictionPool::Slot> out;
  for (std::size_t i : index) out.push_back(pool.Members()[i]);
  return out;
}

TEST(EvictionPoolTest, KeepsInsertionOrderThroughRemovalsInBothViews) {
  EvictionPool pool;
  pool.Grow(8);
  for (EvictionPool::Slot s : {5u, 1u, 7u, 2u, 0u}) pool.Append(s, 10 + s, false);
  pool.Remove(1);  // middle
  pool.Remove(5);  // head
  pool.Remove(0);  // tail
  pool.Append(5, 20, false);  // rejoins at the end
  const std::vector<EvictionPool::Slot> expected{7, 2, 5};
  EXPECT_EQ(ListOrder(pool), expected);
  EXPECT_EQ(DenseOrder(pool), expected);
  EXPECT_EQ(pool.Tail(), 5u);
  for (std::size_t i = 0; i < pool.size(); ++i) EXPECT_EQ(pool.Position(pool.Members()[i]), i);
  EXPECT_TRUE(pool.Contains(7));
  EXPECT_FALSE(pool.Contains(1));
  EXPECT_FALSE(pool.Contains(100));  // beyond the slots: not a member, no crash
}

TEST(EvictionPoolTest, MirrorsLastAccessAndWeightsFollowTheirMember) {
  EvictionPool pool;
  pool.Grow(4);
  pool.Append(0, 1, false);
  pool.Append(1, 2, false);
  pool.Append(2, 3, false);
  pool.Weights()[pool.Position(2)] = 42.0;
  pool.SetLastAccess(2, 99);
  pool.SetLastAccess(3, 7);  // not a member: nothing happens
  pool.Remove(0);            // slot 2 moves into position 0
  EXPECT_EQ(pool.Weights()[pool.Position(2)], 42.0);
  EXPECT_EQ(pool.LastAccesses()[pool.Position(2)], 99.0);
  EXPECT_EQ(pool.LastAccesses()[pool.Position(1)], 2.0);
}

TEST(EvictionPoolTest, CountsMembersThatJoinedWithNegativeBytes) {
  EvictionPool pool;
  pool.Grow(3);
  pool.Append(0, 0, true);
  pool.Append(1, 0, false);
  pool.Append(2, 0, true);
  EXPECT_EQ(pool.NegativeCount(), 2u);
  pool.Remove(0);
  pool.Remove(1);
  EXPECT_EQ(pool.NegativeCount(), 1u);
  pool.Remove(2);
  EXPECT_EQ(pool.NegativeCount(), 0u);
  EXPECT_TRUE(pool.empty());
  EXPECT_EQ(pool.Head(), EvictionPool::kNone);
}

}  // namespace
}  // namespace remat
