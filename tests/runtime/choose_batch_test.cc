// The engine's dense victim scan (policies with staleness weights: dtr-eq, dtr-local, coop) picks exactly the
// victim the default per-candidate path (Policy::Choose over the StorageView, in pool order) picks, with the same
// evaluation count, at every step of random graphs under pressure: same scores, same ties (to the later candidate),
// same early stop at 0. Coop's window search with the engine's precomputed costs finds the same window as the
// search calling WindowCost per block.
#include <memory>
#include <random>
#include <vector>

#include "allocator/arena.h"
#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/engine.h"

namespace remat {
namespace {

class NullExecutor : public Executor {
 public:
  absl::Status Execute(Engine&, OpId, bool, std::span<const std::uint32_t>) override { return absl::OkStatus(); }
  void Evict(Engine&, std::uint32_t) override {}
  absl::Status PageOut(Engine&, std::uint32_t) override { return absl::OkStatus(); }
  absl::Status PageIn(Engine&, std::uint32_t) override { return absl::OkStatus(); }
};

// Places outputs in an arena (owner = storage + 1), as the simulator's executor does.
class ArenaExecutor : public Executor {
 public:
  explicit ArenaExecutor(Arena* arena) : arena_(arena) {}
  absl::Status Execute(Engine& e, OpId, bool, std::span<const std::uint32_t> fresh) override {
    for (std::uint32_t s : fresh) {
      absl::StatusOr<std::uintptr_t> a = arena_->Allocate(static_cast<std::size_t>(e.StorageBytes(s)), OwnerId{s} + 1);
      if (!a.ok()) return a.status();
      e.SetAddress(s, *a);
    }
    return absl::OkStatus();
  }
  void Evict(Engine& e, std::uint32_t s) override { (void)arena_->Free(e.StorageAddress(s)); }

 private:
  Arena* arena_;
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
    ASSERT_EQ(candidates[*slow], *fast) << policy.name() << " among " << candidates.size();
    ASSERT_EQ(slow_evaluations, fast_evaluations);
    ++compared;
  }
}

struct Counts {
  int compared = 0;
  int early_stops = 0;  // choices where the default path stopped at a zero score before the end
  std::int64_t page_outs = 0;
};

void RunRandom(const char* name, std::uint64_t seed, bool free_dead, Counts& counts, int ops = 400,
               std::int64_t budget = 8 * 4096, bool paging = false) {
  std::unique_ptr<Policy> policy = *MakePolicy(name);
  ASSERT_TRUE(policy->HasStalenessWeight());
  std::mt19937_64 rng(seed);
  NullExecutor executor;
  // Sizes and costs from small sets so that exact ties are common; zero costs exercise the early stop, zero sizes
  // infinite scores.
  const std::int64_t sizes[] = {0, 512, 1024, 1024, 4096};
  const std::int64_t costs[] = {0, 1, 5, 5, 100, 1000};
  EngineOptions o;
  o.policy = policy.get();
  o.budget = budget;
  o.free_dead = free_dead;
  if (paging) {  // paged storages count as resident for the neighbourhood sums, and are no victims
    o.paging.mode = OffloadMode::kAlways;
    o.paging.host_budget = 6 * 4096;
  }
  Engine engine(o, &executor);
  std::vector<TensorId> live;
  live.push_back(*engine.Constant(1024));
  for (int i = 0; i < ops; ++i) {
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
    if (rng() % 4 == 0) {  // a direct eviction or a replay changes neighbourhoods outside of pressure
      std::vector<StorageIndex> pool = engine.PoolOrder();
      if (!pool.empty()) (void)engine.Evict(pool[rng() % pool.size()]);
      (void)engine.Rematerialize(live[rng() % live.size()]);
    }
    if (paging && rng() % 4 == 0) {
      std::vector<StorageIndex> pool = engine.PoolOrder();
      if (!pool.empty()) (void)engine.PageOut(pool[rng() % pool.size()]);
      (void)engine.Prefetch(live[rng() % live.size()]);
    }
    std::size_t pool_size = engine.PoolOrder().size();
    std::int64_t before = engine.stats().heuristic_evaluations;
    CheckSameChoice(engine, *policy, counts.compared);
    if (::testing::Test::HasFatalFailure()) return;
    // Only the engine's route counts into its stats: fewer than the pool means the scan stopped at a zero.
    if (pool_size > 0 && (engine.stats().heuristic_evaluations - before) < static_cast<std::int64_t>(pool_size)) {
      ++counts.early_stops;
    }
  }
  counts.page_outs += engine.stats().page_outs;
}

TEST(ChooseBatchTest, DenseScanMatchesDefaultPath) {
  for (const char* name : {"dtr-eq", "dtr-local", "coop"}) {
    Counts counts;
    for (std::uint64_t seed = 1; seed <= 30; ++seed) {
      RunRandom(name, seed, false, counts);
      if (HasFatalFailure()) return;
      RunRandom(name, seed + 1000, true, counts);
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(counts.compared, 1000) << name;
    EXPECT_GT(counts.early_stops, 10) << name;  // the zero-score case was exercised
  }
}

// The same with paging: victims go to a small host tier while it lasts, storages are paged out and prefetched.
TEST(ChooseBatchTest, DenseScanMatchesDefaultPathWithPaging) {
  for (const char* name : {"dtr-eq", "dtr-local", "coop"}) {
    Counts counts;
    for (std::uint64_t seed = 1; seed <= 15; ++seed) {
      RunRandom(name, seed + 3000, seed % 2 == 0, counts, 400, 8 * 4096, /*paging=*/true);
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(counts.compared, 1000) << name;
    EXPECT_GT(counts.page_outs, 200) << name;
  }
}

// Pools of several hundred candidates: the scan's chunks (64 slots), its vector lanes and their tails.
TEST(ChooseBatchTest, DenseScanMatchesDefaultPathOnLargePools) {
  for (const char* name : {"dtr-eq", "coop"}) {
    Counts counts;
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      RunRandom(name, seed + 2000, seed == 2, counts, 1500, 512 * 4096);
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(counts.compared, 3000) << name;
  }
}

// A long chain with a 400-storage run evicted: its union-find class is past the engine's per-class walk limit, so
// changing it marks every weight dirty at once. Replaying the run's first 50 storages (cost 1000 each) drops the
// class's value from 50,350 to 350, which makes storage 700 (cost 1, next to the run's far end, untouched by the
// replay) the cheapest victim: a stale weight would miss it.
TEST(ChooseBatchTest, LargeClassesMatchDefaultPath) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  NullExecutor executor;
  EngineOptions o;
  o.policy = policy.get();
  Engine engine(o, &executor);
  std::vector<TensorId> chain;
  TensorId prev = *engine.Constant(1024);
  OutputSpec out{1024, -1};
  for (int i = 0; i < 1200; ++i) {
    std::int64_t cost = i >= 300 && i < 350 ? 1000 : i >= 350 && i <= 700 ? 1 : 10000;
    prev = (*engine.Call(std::vector<TensorId>{prev}, {&out, 1}, cost, "op"))[0];
    chain.push_back(prev);
  }
  (void)engine.Call(std::vector<TensorId>{}, {}, 1'000'000, "tick");
  for (int i = 300; i < 700; ++i) ASSERT_TRUE(engine.Evict(engine.StorageOf(chain[i])).ok());
  int compared = 0;
  CheckSameChoice(engine, *policy, compared);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_NE(engine.PickVictim(), engine.StorageOf(chain[700]));
  ASSERT_TRUE(engine.Rematerialize(chain[349]).ok());
  CheckSameChoice(engine, *policy, compared);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(engine.PickVictim(), engine.StorageOf(chain[700]));
  // Then evictions and replays in and around the run.
  std::mt19937_64 rng(3);
  for (int step = 0; step < 40; ++step) {
    std::optional<StorageIndex> pick = engine.PickVictim();
    ASSERT_TRUE(pick.has_value());
    ASSERT_TRUE(engine.Evict(*pick).ok());
    CheckSameChoice(engine, *policy, compared);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(engine.Rematerialize(chain[350 + rng() % 350]).ok());
    CheckSameChoice(engine, *policy, compared);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(compared, 82);
}

// The default path stays for sampling and the small-storage filter, and for policies without staleness weights.
TEST(ChooseBatchTest, SamplingAndIgnoreSmallUseTheDefaultPath) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  for (bool sample : {true, false}) {
    NullExecutor executor;
    EngineOptions o;
    o.policy = policy.get();
    o.choose.sample_sqrt = sample;
    o.choose.ignore_small = !sample;
    o.seed = 5;
    Engine engine(o, &executor);
    TensorId prev = *engine.Constant(1024);
    for (int i = 0; i < 200; ++i) {
      OutputSpec out{i % 7 == 0 ? 1 : 4096, -1};
      prev = (*engine.Call(std::vector<TensorId>{prev}, {&out, 1}, 1 + i % 13, "op"))[0];
    }
    (void)engine.Call(std::vector<TensorId>{}, {}, 100, "tick");
    std::vector<StorageIndex> pool = engine.PoolOrder();
    std::vector<StorageId> candidates(pool.begin(), pool.end());
    std::mt19937_64 rng(5);
    ChooseContext ctx{&rng, nullptr};
    for (int k = 0; k < 5; ++k) {  // the same RNG stream on both sides
      std::optional<std::size_t> slow = policy->Choose(engine.view(), candidates, o.choose, ctx);
      std::optional<StorageIndex> fast = engine.PickVictim();
      ASSERT_TRUE(slow && fast);
      EXPECT_EQ(candidates[*slow], *fast);
    }
  }
  EXPECT_FALSE((*MakePolicy("dtr"))->HasStalenessWeight());
  EXPECT_FALSE((*MakePolicy("lru"))->HasStalenessWeight());
}

void ExpectSameWindow(const std::optional<Window>& a, const std::optional<Window>& b) {
  ASSERT_EQ(a.has_value(), b.has_value());
  if (!a) return;
  EXPECT_EQ(a->address, b->address);
  EXPECT_EQ(a->size, b->size);
  EXPECT_EQ(a->cost, b->cost);  // bit for bit
  EXPECT_EQ(a->owners, b->owners);
}

// Coop's window through the engine (costs precomputed into a per-storage array) equals the arena's search calling
// the policy's WindowCost per block, on random graphs in arena mode, for several request sizes.
TEST(ChooseBatchTest, CoopWindowMatchesPerBlockCosts) {
  int compared = 0, non_empty = 0;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::unique_ptr<Policy> policy = *MakePolicy("coop");
    ArenaOptions ao;
    ao.capacity = 64 * 1024;
    ao.alignment = 512;
    std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), ao);
    ArenaExecutor executor(arena.get());
    EngineOptions o;
    o.policy = policy.get();
    o.mode = AccountingMode::kArena;
    o.arena = arena.get();
    Engine engine(o, &executor);
    arena->SetPressureHandler(&engine);
    std::mt19937_64 rng(seed);
    const std::int64_t sizes[] = {512, 1024, 1536, 4096};
    const std::int64_t costs[] = {0, 1, 3, 3, 100};
    std::vector<TensorId> live;
    live.push_back(*engine.Constant(1024));
    for (int i = 0; i < 200; ++i) {
      std::vector<TensorId> inputs;
      int k = 1 + static_cast<int>(rng() % 2);
      for (int j = 0; j < k; ++j) inputs.push_back(live[rng() % live.size()]);
      OutputSpec spec{sizes[rng() % 4], -1};
      absl::StatusOr<std::span<const TensorId>> r = engine.Call(inputs, {&spec, 1}, costs[rng() % 5], "op");
      if (!r.ok()) continue;
      live.push_back((*r)[0]);
      if (live.size() > 16 && rng() % 3 == 0) {
        std::size_t victim = 1 + rng() % (live.size() - 1);
        engine.Release(live[victim]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
      }
      for (std::size_t bytes : {std::size_t{512}, std::size_t{4096}, std::size_t{16384}}) {
        std::optional<Window> slow = arena->FindWindow(bytes, [&](const BlockInfo& b) -> std::optional<double> {
          if (b.owner == kNoOwner) return std::nullopt;
          return policy->WindowCost(engine.view(), b.owner - 1);
        });
        std::optional<Window> fast = engine.PickWindow(bytes);
        ExpectSameWindow(slow, fast);
        if (HasFailure()) return;
        ++compared;
        if (fast && !fast->owners.empty()) ++non_empty;
      }
    }
  }
  EXPECT_GT(compared, 3000);
  EXPECT_GT(non_empty, 1000);
}

}  // namespace
}  // namespace remat
