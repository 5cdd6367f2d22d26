// Engine bridge: with the engine behind the hook, ops run under a budget smaller than what they keep alive;
// storages are evicted and rematerialized, and every value read back is bitwise the one computed without remat.
#include "integration/same_bytes.h"
#include "integration/engine_session.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "integration/cpu_allocator.h"
#include "tests/integration/arena_layout_workload.h"
#include "tests/integration/chain_workload.h"

namespace remat::integration {
namespace {

constexpr std::size_t kKiB = 1024;


TEST(EngineBridge, ChainUnderATightBudgetIsBitwiseIdentical) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB, a constant for remat
  at::manual_seed(7);
  const std::vector<at::Tensor> reference = Chain(x, 24);  // 24 x 64 KiB kept alive
  {
    EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
    at::manual_seed(7);
    std::vector<at::Tensor> ys = Chain(x, 24);
    for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
    absl::StatusOr<BridgeStats> stats = GetEngineStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->engine.evictions, 0);
    EXPECT_GT(stats->engine.rematerializations, 0);
    absl::StatusOr<CpuArenaStats> arena = GetCpuArenaStats();
    ASSERT_TRUE(arena.ok());
    EXPECT_LE(arena->peak_allocated_bytes, 640 * kKiB);
  }
  EXPECT_FALSE(RematEngineEnabled());
}

TEST(EngineBridge, EveryPolicyReproducesTheChain) {
  const at::Tensor x = at::randn({64, 64});
  at::manual_seed(3);
  const std::vector<at::Tensor> reference = Chain(x, 18);
  for (const char* policy : {"dtr", "dtr-eq", "dtr-local", "msps", "lru", "largest", "random", "dte", "coop"}) {
    EngineGuard guard(EngineSessionOptions{200 * kKiB, policy});
    at::manual_seed(3);
    std::vector<at::Tensor> ys = Chain(x, 18);
    for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << policy << " " << i;
    EXPECT_GT(GetEngineStats()->engine.evictions, 0) << policy;
  }
}

TEST(EngineBridge, TensorsStayReadableAfterDisable) {
  const at::Tensor x = at::randn({64, 64});
  at::manual_seed(5);
  const std::vector<at::Tensor> reference = Chain(x, 12);
  std::vector<at::Tensor> ys;
  {
    EngineGuard guard(EngineSessionOptions{160 * kKiB, "lru"});
    at::manual_seed(5);
    ys = Chain(x, 12);
  }
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
}

TEST(EngineBridge, TooSmallABudgetIsOutOfMemoryNamingTheRequest) {
  EngineGuard guard(EngineSessionOptions{64 * kKiB, "dtr-eq"});
  try {
    (void)at::empty({1 << 16});  // 256 KiB
    FAIL() << "no OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("tried to allocate 262144 bytes"));
  }
  // The engine is still usable.
  at::Tensor a = at::randn({16, 16});
  EXPECT_TRUE(SameBytes(at::mm(a, a), at::mm(a, a)));
}

TEST(EngineBridge, UnknownPolicyListsTheRegisteredOnes) {
  const absl::Status status = EnableRematEngine(EngineSessionOptions{1 << 20, "belady"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), testing::HasSubstr("dtr-eq"));
  EXPECT_FALSE(RematEngineEnabled());
  EXPECT_EQ(c10::GetCPUAllocator() == RematCpuAllocator(), CpuArenaInstalled());
}

}  // namespace
}  // namespace remat::integration

namespace remat::integration {
namespace {

// A storage only kept records hold (y, which cos's record reads) keeps its bytes until the bridge releases it: that
// happens at the next op, with a budget that never binds (a later release would raise the peak). A storage no record
// holds (u) gives its bytes back through torch's own free the moment it dies (the engine hears of it later).
TEST(EngineBridgeSweep, WhatOnlyRecordsHoldIsReleasedAtTheNextOp) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB, made before remat: outside the arena
  EngineGuard guard(EngineSessionOptions{64 * 1024 * kKiB, "dtr-eq"});
  auto allocated = [] { return GetCpuArenaStats()->allocated_bytes; };
  at::Tensor u = at::sin(x);
  const std::size_t with_u = allocated();
  u.reset();
  EXPECT_EQ(allocated(), with_u - 64 * kKiB);
  at::Tensor y = at::sin(x);
  const at::Tensor z = at::cos(y);
  const std::size_t with_y = allocated();
  y.reset();
  EXPECT_EQ(allocated(), with_y);  // the record still holds y's bytes
  const at::Tensor w = at::tanh(z);
  EXPECT_EQ(allocated(), with_y);  // w came (64 KiB), y went (64 KiB)
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->released, 1);
}

TEST(EngineBridgeRelocation, ConstantsMoveOutOfTheWayWithTheirBytes) {
  const at::Tensor small = at::randn({128, 128});  // 64 KiB, made before remat: outside the arena
  const at::Tensor big = at::randn({256, 128});    // 128 KiB
  const at::Tensor expected = at::sin(big);
  EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
  const ConstantsBetweenHoles layout = ConstantsBetweenHoles::Make(small);
  const at::Tensor y = at::sin(big);
  EXPECT_TRUE(SameBytes(y, expected));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  // They move out of the way (relocated) or slide together (compacted, before any eviction): either way, with
  // their bytes.
  EXPECT_GE(layout.ExpectBytesKept(), 1);
  EXPECT_GE(stats->engine.relocations + stats->engine.compactions, 1);
  EXPECT_LE(GetCpuArenaStats()->peak_allocated_bytes, 640 * kKiB);
}

}  // namespace
}  // namespace remat::integration

namespace remat::integration {
namespace {

// Under a budget of three 64 KiB blocks, x sits between two holes of 64 KiB, and cat(x, x) needs 128 KiB while
// its kernel reads x: nothing can move x then, so the kernel runs out of memory. It writes nothing, so the hook
// runs it again once the engine has slid x out of the way; the result is the one computed without remat.
TEST(EngineBridgeRetry, AKernelWhoseInputSplitsTheFreeBytesRunsAgainAfterCompaction) {
  const at::Tensor small = at::randn({128, 128});  // 64 KiB, made before remat: outside the arena
  const at::Tensor expected = at::cat({at::sin(small), at::sin(small)});
  EngineGuard guard(EngineSessionOptions{192 * kKiB, "dtr-eq"});
  const InputBetweenHoles layout = InputBetweenHoles::Make(small);
  ASSERT_TRUE(layout.laid_out) << "x did not land between its two 64 KiB neighbours";
  const at::Tensor& x = layout.x;
  const std::uintptr_t base = layout.base;
  ASSERT_LT(GetCpuArenaStats()->largest_free_block, 128 * kKiB);
  const at::Tensor y = at::cat({x, x});
  EXPECT_TRUE(SameBytes(y, expected));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->retried_ops, 1);
  EXPECT_GE(stats->engine.compactions, 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x.const_data_ptr()), base);  // slid down onto the first hole
  EXPECT_LE(GetCpuArenaStats()->peak_allocated_bytes, 192 * kKiB);
}

}  // namespace
}  // namespace remat::integration

namespace remat::integration {
namespace {

// What a backward pass computes (the parameters' gradients, the gradients between layers) is deferred: evicted only
// when nothing else can be. What the forward pass computes is not.
TEST(EngineBridgeBackward, OutputsOfTheBackwardPassAreDeferred) {
  at::Tensor w = at::randn({64, 64});
  w.set_requires_grad(true);
  at::Tensor v = at::randn({64, 64});
  v.set_requires_grad(true);
  const at::Tensor x = at::randn({64, 64});
  EngineGuard guard(EngineSessionOptions{4 << 20, "dtr-eq"});
  const at::Tensor loss = at::sum(at::tanh(at::mm(at::tanh(at::mm(x, w)), v)));
  EXPECT_EQ(GetEngineStats()->deferred_outputs, 0);
  loss.backward();
  ASSERT_TRUE(w.grad().defined() && v.grad().defined());
  // At least the two gradients; also tanh_backward's results and the gradient between the two products.
  EXPECT_GE(GetEngineStats()->deferred_outputs, 4);
}

}  // namespace
}  // namespace remat::integration
