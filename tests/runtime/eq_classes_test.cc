#include "runtime/eq_classes.h"

#include "gtest/gtest.h"

namespace remat {
namespace {

TEST(EqClassesTest, MergeSumsAndSubtractionNeverSplits) {
  EqClasses eq;
  std::int32_t a = eq.Add(3), b = eq.Add(5), c = eq.Add(7);
  eq.Merge(a, b);
  EXPECT_EQ(eq.Find(a), eq.Find(b));
  EXPECT_EQ(eq.Value(a), 8);
  eq.Merge(b, a);  // already one class
  EXPECT_EQ(eq.Value(b), 8);
  eq.Merge(c, a);
  EXPECT_EQ(eq.Value(c), 15);
  eq.Value(b) -= 5;  // b rematerialized: its cost leaves the class, which stays one class
  EXPECT_EQ(eq.Value(a), 10);
  EXPECT_EQ(eq.Find(a), eq.Find(c));
}

}  // namespace
}  // namespace remat
