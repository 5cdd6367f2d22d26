// PageInOrder: the order learned from reads of paged storages, the candidates per key, and the bound on its lists.
#include "runtime/page_in_order.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace remat {
namespace {

using Key = PageInOrder::Key;

const Key kMm{1, 65536, 0};
const Key kTanh{2, 65536, 0};
const Key kWeight{0, 65536, 8};

TEST(PageInOrder, NextFollowsTheOrderThePreviousPassRead) {
  PageInOrder order;
  EXPECT_TRUE(order.Next(2).empty());  // nothing known yet
  for (const Key& key : {kTanh, kMm, kWeight}) order.NoteRead(key);
  EXPECT_TRUE(order.learned());
  order.NoteRead(kTanh);  // the next pass starts as the last one did
  EXPECT_EQ(order.Next(2), (std::vector<Key>{kMm, kWeight}));
  order.NoteRead(kWeight);  // this pass departs: what came after the weight last time
  EXPECT_EQ(order.Next(1), (std::vector<Key>{kTanh}));
}

TEST(PageInOrder, TakeGivesTheLastPagedOutOfAKeyThatIsStillPaged) {
  PageInOrder order;
  std::set<std::uint32_t> paged;
  auto still = [&](std::uint32_t s, Key) { return paged.contains(s); };
  for (std::uint32_t s : {10u, 11u, 12u}) {
    paged.insert(s);
    order.NotePagedOut(s, kMm, still);
  }
  paged.insert(20);
  order.NotePagedOut(20, kTanh, still);
  paged.erase(12);  // came back on demand
  EXPECT_EQ(order.Take(kMm, still), 11);
  EXPECT_EQ(order.Take(kWeight, still), -1);
  EXPECT_EQ(order.TakeMostRecent(still), 20);
  paged.erase(10);
  EXPECT_EQ(order.Take(kMm, still), -1);
}

// Storages paged out and brought back on demand (never taken) do not pile up in the candidate lists.
TEST(PageInOrder, ListsStayBoundedWhenPagesComeBackOnDemand) {
  PageInOrder order;
  std::set<std::uint32_t> paged;
  auto still = [&](std::uint32_t s, Key) { return paged.contains(s); };
  for (std::uint32_t s = 0; s < 100000; ++s) {
    paged.insert(s);
    order.NotePagedOut(s, s % 2 ? kMm : kTanh, still);
    if (s >= 3) {  // three stay paged at a time
      paged.erase(s - 3);
      order.NotePagedBack();
    }
  }
  EXPECT_LE(order.listed(), 2 * 4 + 64 + 1u);  // compacted past twice the four paged at the check, plus 64
  EXPECT_GE(order.Take(kMm, still), 99997);
}

}  // namespace
}  // namespace remat
