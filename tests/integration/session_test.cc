// Session: the C++ API (RematGuard) switches the arena and the hook on together and off again.
#include "integration/session.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "integration/dispatch_hook.h"

namespace remat::integration {
namespace {

TEST(Session, GuardEnablesArenaAndTrackingAndRestoresBoth) {
  c10::Allocator* original = c10::GetCPUAllocator();
  {
    RematGuard guard(RematOptions{8 << 20});
    EXPECT_TRUE(RematEnabled());
    EXPECT_TRUE(HookEnabledOnThisThread());
    EXPECT_EQ(c10::GetCPUAllocator(), RematCpuAllocator());
    EXPECT_EQ(EnableRemat(RematOptions{8 << 20}).code(), absl::StatusCode::kAlreadyExists);
    at::Tensor x = at::ones({64}).set_requires_grad(true);
    at::sum(at::relu(x)).backward();
    const RematStats stats = GetRematStats();
    EXPECT_TRUE(stats.enabled);
    EXPECT_EQ(stats.arena.budget, 8u << 20);
    EXPECT_GT(stats.arena.peak_allocated_bytes, 0u);
    EXPECT_GE(stats.ops_recorded, 4u);  // ones, relu, sum, and backward ops
    EXPECT_GT(stats.op_time_ns, 0u);
    EXPECT_THROW((void)at::empty({16 << 20}), c10::OutOfMemoryError);
  }
  EXPECT_FALSE(RematEnabled());
  EXPECT_FALSE(HookEnabledOnThisThread());
  EXPECT_EQ(c10::GetCPUAllocator(), original);
  EXPECT_FALSE(GetRematStats().enabled);
  EXPECT_EQ(DisableRemat().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THROW(RematGuard(RematOptions{0}), c10::Error) << "a zero budget";
  EXPECT_FALSE(RematEnabled());
}

}  // namespace
}  // namespace remat::integration

namespace remat::integration {
namespace {

// Ops on several threads at once: each thread switches the hook on for itself; all allocate from one arena.
TEST(Session, ConcurrentThreadsShareTheArenaAndTheHook) {
  RematGuard guard(RematOptions{64 << 20});
  const std::uint64_t ops_before = GetRematStats().ops_recorded;
  constexpr int kThreads = 4;
  constexpr int kIterations = 300;
  std::vector<std::thread> threads;
  std::vector<float> sums(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &sums] {
      ScopedHook hook;
      at::Tensor acc = at::ones({64});
      for (int i = 0; i < kIterations; ++i) acc = at::relu(at::add(acc, 1.0));  // two recorded ops per iteration
      sums[t] = acc.sum().item<float>();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (float sum : sums) EXPECT_EQ(sum, 64.0f * (1 + kIterations));
  const RematStats stats = GetRematStats();
  EXPECT_GE(stats.ops_recorded - ops_before, static_cast<std::uint64_t>(kThreads * kIterations * 2));
  EXPECT_EQ(stats.arena.failed_allocations, 0u);
  EXPECT_GT(stats.arena.allocations, static_cast<std::uint64_t>(kThreads * kIterations));
}

}  // namespace
}  // namespace remat::integration
