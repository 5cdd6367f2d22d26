// Tests for integration/op_cost.h: the estimate on ops recorded by the real dispatch hook.
#include "integration/op_cost.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

namespace remat::integration {
namespace {

class Keeper : public OpObserver {
 public:
  void BeforeOp(OpRecord&) override {}
  void AfterOp(OpRecord&& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    records.push_back(std::make_shared<OpRecord>(std::move(record)));
  }
  void OpFailed(OpRecord&) noexcept override {}
  std::mutex mutex_;
  std::vector<std::shared_ptr<OpRecord>> records;
};

class OpCostTest : public ::testing::Test {
 protected:
  void SetUp() override { SetObserver(&keeper_); }
  void TearDown() override { SetObserver(nullptr); }
  // Runs `op` under the hook and returns the estimate of the one op it recorded.
  template <typename Op>
  std::int64_t CostOf(Op op) {
    {
      ScopedHook hook;
      (void)op();
    }
    EXPECT_EQ(keeper_.records.size(), 1u);
    const std::int64_t cost = keeper_.records.empty() ? -1 : EstimatedCostNs(*keeper_.records.back());
    keeper_.records.clear();
    return cost;
  }
  Keeper keeper_;
};

TEST_F(OpCostTest, ElementwiseOpsCostTheirBytes) {
  const at::Tensor x = at::randn({64, 32});
  const at::Tensor y = at::randn({64, 32});
  // 1000 ns + 3 x 8192 bytes at 0.1 ns per byte.
  EXPECT_EQ(CostOf([&] { return at::add(x, y); }), 1000 + 2457);
}

TEST_F(OpCostTest, MatrixProductsAlsoCostTheirMultiplyAdds) {
  const at::Tensor a = at::randn({64, 32});
  const at::Tensor b = at::randn({32, 16});
  // 1000 ns + (8192 + 2048 + 4096) bytes x 0.1 + 2 x 64 x 32 x 16 flops x 0.05.
  EXPECT_EQ(CostOf([&] { return at::mm(a, b); }), static_cast<std::int64_t>(1000 + 1433.6 + 3276.8));
}

TEST_F(OpCostTest, ConvolutionCostsOutputsTimesKernelVolume) {
  const at::Tensor input = at::randn({1, 2, 8, 8});
  const at::Tensor weight = at::randn({3, 2, 3, 3});
  const std::int64_t cost = CostOf([&] {
    return at::convolution(input, weight, std::nullopt, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1);
  });
  // Output 1x3x6x6 = 108 elements, 2 x 3 x 3 = 18 multiply-adds each; bytes 512 + 216 + 432 floats x 4.
  const double bytes = (128 + 54 + 108) * 4.0;
  EXPECT_EQ(cost, static_cast<std::int64_t>(1000 + 0.1 * bytes + 0.05 * 2 * 108 * 18));
}

TEST_F(OpCostTest, SparseArgumentsCountNoBytesInsteadOfThrowing) {
  // torch has no nbytes for a sparse tensor (it throws); a sparse embedding's gradient reaches ops like this add.
  const at::Tensor dense = at::randn({64, 32});
  const at::Tensor sparse = at::randn({64, 32}).to_sparse();
  // 1000 ns + (the dense argument's and the output's 8192 bytes) x 0.1.
  EXPECT_EQ(CostOf([&] { return at::add(dense, sparse); }), 1000 + 1638);
}

}  // namespace
}  // namespace remat::integration
