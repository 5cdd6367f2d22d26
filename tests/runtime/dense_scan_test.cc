// The dense scan's pass 1 (runtime/dense_scan.h): every variant (two lanes, four lanes where the CPU has AVX2, the
// dispatching one) returns exactly the scalar loop's per-chunk and overall minima, on random arrays with the
// special cases mixed in: zero weights, infinite weights (zero bytes), zero staleness, and lengths that leave
// partial chunks and partial vectors.
#include "runtime/dense_scan.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace remat {
namespace {

using Variant = double (*)(const double*, const double*, std::size_t, double, double*);

TEST(DenseScanTest, ApproxScoreSpecialCases) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ApproxScore(6, 10, 13), 2.0);
  EXPECT_EQ(ApproxScore(6, 13, 13), kInf);  // staleness 0
  EXPECT_EQ(ApproxScore(0, 13, 13), kInf);  // 0 / 0 is discarded, not NaN
  EXPECT_EQ(ApproxScore(0, 10, 13), 0.0);
  EXPECT_EQ(ApproxScore(kInf, 10, 13), kInf);
  EXPECT_EQ(ApproxScore(6, 14, 13), kInf);  // negative staleness
}

TEST(DenseScanTest, VariantsMatchTheScalarLoop) {
  std::vector<Variant> variants = {&ChunkMinimaTwoLanes, &ChunkMinima};
  if (CpuHasAvx2()) variants.push_back(&ChunkMinimaFourLanes);
  std::mt19937_64 rng(11);
  const double clock = 1e6;
  int checked = 0;
  for (std::size_t n : {0, 1, 2, 3, 5, 63, 64, 65, 127, 130, 1000, 10001}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<double> weight(n), last(n);
      for (std::size_t i = 0; i < n; ++i) {
        const int kind = static_cast<int>(rng() % 16);
        weight[i] = kind == 0 ? 0.0 : kind == 1 ? std::numeric_limits<double>::infinity()
                                                : static_cast<double>(1 + rng() % 100000) / 1024.0;
        last[i] = kind == 2 || kind == 3 ? clock : static_cast<double>(rng() % 1000000);
      }
      std::vector<double> expected(n / kScanChunk + 1, -1), got(n / kScanChunk + 1, -1);
      const double expected_min = ChunkMinimaScalar(weight.data(), last.data(), n, clock, expected.data());
      for (Variant v : variants) {
        std::fill(got.begin(), got.end(), -1);
        const double min = v(weight.data(), last.data(), n, clock, got.data());
        ASSERT_EQ(min, expected_min) << "n " << n;
        ASSERT_EQ(got, expected) << "n " << n;
        ++checked;
      }
      if (n > 0) {  // the overall minimum is one of the scores
        bool found = false;
        for (std::size_t i = 0; i < n; ++i) found = found || ApproxScore(weight[i], last[i], clock) == expected_min;
        ASSERT_TRUE(found);
      } else {
        ASSERT_EQ(expected_min, std::numeric_limits<double>::infinity());
      }
    }
  }
  EXPECT_GE(checked, 12 * 20 * 2);
}

}  // namespace
}  // namespace remat
