// Opaque calls (opaque_call.h): code remat cannot see into (a torch.compile'd graph) runs as one op whose inputs
// are brought back and locked for the length of the call, whose inner ops are not recorded, whose outputs are
// constants, and whose written inputs are treated as writes to constants.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <vector>

#include "integration/dispatch_hook.h"
#include "integration/opaque_call.h"
#include "integration/engine_session.h"
#include "integration/same_bytes.h"
#include "integration/storage_eviction.h"
#include "tests/integration/chain_workload.h"

namespace remat::integration {
namespace {

constexpr std::size_t kKiB = 1024;

bool Evicted(const at::Tensor& t) { return IsEvicted(*t.storage().unsafeGetStorageImpl()); }

TEST(OpaqueCall, InputsComeBackAndStayResidentWhileTheCallAllocatesUnderPressure) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB, a constant for remat
  at::manual_seed(7);
  const std::vector<at::Tensor> reference = Chain(x, 24);
  EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
  at::manual_seed(7);
  const std::vector<at::Tensor> ys = Chain(x, 24);
  // Two evicted ones (which ones depends on measured op costs) are the call's inputs.
  std::vector<std::size_t> evicted;
  for (std::size_t i = 0; i < ys.size(); ++i) {
    if (Evicted(ys[i])) evicted.push_back(i);
  }
  ASSERT_GE(evicted.size(), 2u) << "the chain should not fit: the test needs evicted inputs";
  const at::Tensor& a = ys[evicted[0]];
  const at::Tensor& b = ys[evicted[1]];
  const std::int64_t ops_before = GetEngineStats()->ops;
  const std::int64_t pinned_before = GetEngineStats()->pinned_outputs;
  const std::int64_t evictions_before = GetEngineStats()->engine.evictions;

  BeginOpaqueCall({}, {a, b});
  EXPECT_FALSE(Evicted(a));
  EXPECT_FALSE(Evicted(b));
  // Inside: six 64 KiB blocks the engine does not know, so it makes room by evicting what the call does not read.
  std::vector<at::Tensor> scratch;
  for (int i = 0; i < 6; ++i) scratch.push_back(at::empty({128, 128}));
  EXPECT_GT(GetEngineStats()->engine.evictions, evictions_before);
  EXPECT_FALSE(Evicted(a));
  EXPECT_FALSE(Evicted(b));
  const at::Tensor product = at::mm(a, b);  // passes through, unrecorded
  scratch.clear();
  EndOpaqueCall({product});

  EXPECT_EQ(GetEngineStats()->ops, ops_before + 1) << "the call is one op; the ops inside are not recorded";
  EXPECT_EQ(GetEngineStats()->pinned_outputs, pinned_before + 1) << "its output is a constant";
  EXPECT_TRUE(SameBytes(product, at::mm(reference[evicted[0]], reference[evicted[1]])));
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
}

TEST(OpaqueCall, AWrittenInputFirstPinsWhatWasComputedFromItsOldBytes) {
  const at::Tensor w = at::randn({128, 128});  // made before enable: a constant
  const at::Tensor old_sin = at::sin(w);
  const at::Tensor x = at::randn({128, 128});
  EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
  const at::Tensor y = at::sin(w);  // evictable: a replay would read w
  BeginOpaqueCall({w}, {});
  w.add_(1.0);  // the call writes w behind the engine's back (it passes through)
  EndOpaqueCall({});
  at::manual_seed(1);
  const std::vector<at::Tensor> pressure = Chain(x, 24);  // evicts whatever it can
  EXPECT_FALSE(Evicted(y)) << "y must be pinned: its replay would read the new w";
  EXPECT_TRUE(SameBytes(y, old_sin));
}

TEST(OpaqueCall, AFailedCallReleasesItsInputsAndAnUnmatchedEndIsAnError) {
  const at::Tensor x = at::randn({128, 128});
  at::manual_seed(3);
  const std::vector<at::Tensor> reference = Chain(x, 24);
  EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
  at::manual_seed(3);
  std::vector<at::Tensor> ys = Chain(x, 12);
  BeginOpaqueCall({}, {ys[10], ys[11]});
  OpaqueCallFailed();
  // The inputs are no longer locked: more work evicts them, and they come back with their bytes.
  at::manual_seed(11);
  const std::vector<at::Tensor> more = Chain(ys[11], 40);
  EXPECT_TRUE(Evicted(ys[10]) || Evicted(ys[11]));
  EXPECT_TRUE(SameBytes(ys[10], reference[10]));
  EXPECT_TRUE(SameBytes(ys[11], reference[11]));
  EXPECT_THROW(EndOpaqueCall({}), c10::Error);
}

TEST(OpaqueCall, WithRematOffTheCallsOnlyNest) {
  const at::Tensor a = at::randn({8, 8});
  BeginOpaqueCall({}, {a});
  const at::Tensor b = at::mm(a, a);
  EndOpaqueCall({b});
  EXPECT_THROW(EndOpaqueCall({}), c10::Error);
}

}  // namespace
}  // namespace remat::integration
