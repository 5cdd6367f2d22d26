// Session: the C++ API (RematGuard) switches the arena and the hook on together and off again.
#include "integration/session.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

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
