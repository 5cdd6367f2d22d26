#include "policies/policy.h"

#include <cmath>
#include <limits>
#include <memory>

#include "gtest/gtest.h"
#include "policies/dtr.h"
#include "policies/simple.h"
#include "policies/window.h"
#include "tests/policies/fake_view.h"

namespace remat {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::optional<std::size_t> ChooseAll(const Policy& p, const FakeView& v, ChooseOptions options = {},
                                     std::mt19937_64* rng = nullptr, std::int64_t* evals = nullptr) {
  std::vector<StorageId> ids;
  for (std::size_t i = 0; i < v.s.size(); ++i) ids.push_back(i);
  ChooseContext ctx{rng, evals};
  return p.Choose(v, ids, options, ctx);
}

TEST(PolicyTest, DtrFamilyScores) {
  FakeView v;
  v.clock = 101;
  v.s = {{.bytes = 100, .compute = 10, .last_access = 1, .region = 30, .ancestors = 5, .eq = 20}};
  EXPECT_DOUBLE_EQ(MakeDtrPolicy()->Score(v, 0), 40.0 / (100 * 100));
  EXPECT_DOUBLE_EQ(MakeDtrEqPolicy()->Score(v, 0), 30.0 / (100 * 100));
  EXPECT_DOUBLE_EQ(MakeDtrLocalPolicy()->Score(v, 0), 10.0 / (100 * 100));
  EXPECT_DOUBLE_EQ(MakeMspsPolicy()->Score(v, 0), 15.0 / 100);
  EXPECT_DOUBLE_EQ(MakeLruPolicy()->Score(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(MakeLargestPolicy()->Score(v, 0), 1.0 / 100);
  v.s[0].adjacent_free = 300;
  EXPECT_DOUBLE_EQ(MakeDtePolicy()->Score(v, 0), 30.0 / (400 * 100));
  v.s[0].neighbours = 6;
  EXPECT_DOUBLE_EQ(MakeCoopPolicy()->Score(v, 0), 16.0 / 100);  // no size term
}

TEST(PolicyTest, FreshStorageAndEmptyStorageScoreInfinity) {
  FakeView v;
  v.s = {{.bytes = 100, .last_access = 100}, {.bytes = 0, .last_access = 1}};
  EXPECT_EQ(MakeDtrLocalPolicy()->Score(v, 0), kInf);
  EXPECT_EQ(MakeDtrLocalPolicy()->Score(v, 1), kInf);
  EXPECT_EQ(MakeLargestPolicy()->Score(v, 1), kInf);
  EXPECT_FALSE(MakeCoopPolicy()->WindowCost(v, 0).has_value());  // staleness 0 is a barrier
}

TEST(PolicyTest, TiesGoToTheLaterCandidateAndAllInfiniteStillChooses) {
  FakeView v;
  v.s = {{.last_access = 5}, {.last_access = 5}, {.last_access = 9}};
  EXPECT_EQ(ChooseAll(*MakeLruPolicy(), v), 1u);
  v.s = {{.last_access = 100}, {.last_access = 100}};
  EXPECT_EQ(ChooseAll(*MakeDtrLocalPolicy(), v), 1u);
  v.s.clear();
  EXPECT_FALSE(ChooseAll(*MakeDtrLocalPolicy(), v).has_value());
}

TEST(PolicyTest, ZeroScoreStopsTheScan) {
  FakeView v;
  v.s = {{.compute = 5}, {.compute = 0}, {.compute = 0}, {.compute = 1}};
  std::int64_t evals = 0;
  EXPECT_EQ(ChooseAll(*MakeDtrLocalPolicy(), v, {}, nullptr, &evals), 1u);
  EXPECT_EQ(evals, 2);
}

TEST(PolicyTest, SqrtSamplingScoresAboutSqrtNCandidates) {
  FakeView v;
  for (int i = 0; i < 10000; ++i) v.s.push_back({.compute = 1 + i % 97, .last_access = i % 50});
  std::mt19937_64 rng(3);
  std::int64_t evals = 0;
  ChooseOptions o;
  o.sample_sqrt = true;
  ASSERT_TRUE(ChooseAll(*MakeDtrLocalPolicy(), v, o, &rng, &evals).has_value());
  EXPECT_EQ(evals, 100);
}

TEST(PolicyTest, IgnoreSmallSkipsStoragesBelowOnePercentOfTheMean) {
  FakeView v;
  // The tiny storage has the best score but is below 1% of the mean size.
  v.s = {{.bytes = 1, .compute = 1, .last_access = 0},
         {.bytes = 1000, .compute = 20, .last_access = 99},
         {.bytes = 1000, .compute = 30, .last_access = 99}};
  EXPECT_EQ(ChooseAll(*MakeDtrLocalPolicy(), v), 0u);
  ChooseOptions o;
  o.ignore_small = true;
  EXPECT_EQ(ChooseAll(*MakeDtrLocalPolicy(), v, o), 1u);
}

TEST(PolicyTest, RandomIsSeededAndInRange) {
  FakeView v;
  v.s.resize(50);
  std::mt19937_64 a(7), b(7);
  for (int i = 0; i < 20; ++i) {
    std::optional<std::size_t> x = ChooseAll(*MakeRandomPolicy(), v, {}, &a);
    std::optional<std::size_t> y = ChooseAll(*MakeRandomPolicy(), v, {}, &b);
    ASSERT_TRUE(x.has_value());
    EXPECT_LT(*x, 50u);
    EXPECT_EQ(x, y);
  }
}

TEST(PolicyTest, CostlyOps) {
  // Trace names (unqualified) and the PyTorch path's qualified names with overloads.
  for (const char* n : {"convolution", "cudnn_convolution", "convolution_backward", "mm", "bmm", "addmm", "matmul",
                        "linear", "aten::mm", "aten::mm.out", "aten::convolution", "aten::convolution_backward",
                        "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_convolution", "aten::mkldnn_convolution",
                        "aten::conv2d", "aten::linear", "remat::compiled_graph"}) {
    EXPECT_TRUE(IsCostlyOp(n)) << n;
  }
  for (const char* n : {"relu", "add", "t", "threshold_backward", "batch_norm", "view", "aten::relu", "aten::add.Tensor",
                        "upsample_bilinear2d", "aten::upsample_bilinear2d", "aten::_convert_indices_from_coo_to_csr",
                        "aten::mul", "aten::native_batch_norm", "prims::convert_element_type",
                        "convert_element_type"}) {
    EXPECT_FALSE(IsCostlyOp(n)) << n;
  }
}

}  // namespace
}  // namespace remat
