// The engine's batch fast path (Policy::SupportsBatch / ChooseBatch, used by dtr-eq) picks exactly the victim the
// default per-candidate path (Policy::Choose over the StorageView) picks, with the same evaluation count, at every
// step of random graphs under pressure: same scores, same ties (to the later candidate), same early stop at 0.
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/engine.h"

namespace remat {
namespace {

class NullExecutor : public Executor {
 public:
  absl::Status Execute(Engine&, OpId, bool, std::span<const std::uint32_t>) override { return absl::OkStatus(); }
  void Evict(Engine&, std::uint32_t) override {}
};

void CheckSameChoice(Engine& engine, const Policy& policy, int& compared) {
  std::vector<StorageIndex> pool = engine.PoolOrder();
  std::vector<StorageId> candidates(pool.begin(), pool.end());
  std::mt19937_64 rng(7);
  std::int64_t slow_evaluations = 0;
  ChooseContext ctx{&rng, &slow_evaluations};
  std::optional<std::size_t> slow = policy.Policy::Choose(engine.view(), candidates, ChooseOptions{}, ctx);
  std::int64_t before = engine.stats().heuristic_evaluations;
  std::optional<StorageIndex> fast = engine.PickVictim();
  std::int64_t fast_evaluations = engine.stats().heuristic_evaluations - before;
  ASSERT_EQ(slow.has_value(), fast.has_value());
  if (slow) {
    ASSERT_EQ(candidates[*slow], *fast);
    ASSERT_EQ(slow_evaluations, fast_evaluations);
    ++compared;
  }
}

void RunRandom(std::uint64_t seed, bool free_dead, int& compared) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  ASSERT_TRUE(policy->SupportsBatch(ChooseOptions{}));
  std::mt19937_64 rng(seed);
  NullExecutor executor;
  // Sizes and costs from small sets so that exact ties are common; some zero costs exercise the early stop.
  const std::int64_t sizes[] = {0, 512, 1024, 1024, 4096};
  const std::int64_t costs[] = {0, 1, 5, 5, 100, 1000};
  EngineOptions o;
  o.policy = policy.get();
  o.budget = 8 * 4096;
  o.free_dead = free_dead;
  Engine engine(o, &executor);
  std::vector<TensorId> live;
  live.push_back(*engine.Constant(1024));
  for (int i = 0; i < 400; ++i) {
    std::vector<TensorId> inputs;
    int k = 1 + static_cast<int>(rng() % 3);
    for (int j = 0; j < k; ++j) inputs.push_back(live[rng() % live.size()]);
    int outs = 1 + static_cast<int>(rng() % 2);
    std::vector<OutputSpec> specs;
    for (int j = 0; j < outs; ++j) {
      OutputSpec spec{sizes[rng() % 5], -1};
      if (rng() % 6 == 0) spec.alias = 0;
      specs.push_back(spec);
    }
    absl::StatusOr<std::span<const TensorId>> r =
        engine.Call(inputs, specs, costs[rng() % 6], "op");
    if (!r.ok()) continue;  // out of memory under a tiny budget: the engine stays usable
    for (TensorId t : *r) live.push_back(t);
    if (live.size() > 24 && rng() % 3 == 0) {
      std::size_t victim = 1 + rng() % (live.size() - 1);
      engine.Release(live[victim]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    CheckSameChoice(engine, *policy, compared);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(ChooseBatchTest, DtrEqBatchMatchesDefaultPath) {
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    RunRandom(seed, false, compared);
    if (HasFatalFailure()) return;
    RunRandom(seed + 1000, true, compared);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(compared, 1000);
}

TEST(ChooseBatchTest, SamplingAndIgnoreSmallUseTheDefaultPath) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  ChooseOptions sample;
  sample.sample_sqrt = true;
  ChooseOptions small;
  small.ignore_small = true;
  EXPECT_FALSE(policy->SupportsBatch(sample));
  EXPECT_FALSE(policy->SupportsBatch(small));
  EXPECT_FALSE((*MakePolicy("dtr"))->SupportsBatch(ChooseOptions{}));
}

}  // namespace
}  // namespace remat
