// Victim choice among 10,000 candidates for every policy, and Coop's window search over 10,000 arena blocks.
//
// The graph: a chain of 20,000 ops of 1 KiB outputs where every other storage is evicted, so each of the 10,000
// resident candidates has evicted neighbours on both sides (the eq classes and regions are non-trivial).
#include <memory>
#include <string>
#include <vector>

#include "allocator/arena.h"
#include "benchmark/benchmark.h"
#include "policies/registry.h"
#include "runtime/dense_scan.h"
#include "runtime/engine.h"

namespace remat {
namespace {

class NullExecutor : public Executor {
 public:
  explicit NullExecutor(Arena* arena = nullptr) : arena_(arena) {}
  absl::Status Execute(Engine& e, OpId, bool, std::span<const std::uint32_t> fresh) override {
    if (arena_ == nullptr) return absl::OkStatus();
    for (std::uint32_t s : fresh) {
      absl::StatusOr<std::uintptr_t> a = arena_->Allocate(e.StorageBytes(s), OwnerId{s} + 1);
      if (!a.ok()) return a.status();
      e.SetAddress(s, *a);
    }
    return absl::OkStatus();
  }
  void Evict(Engine& e, std::uint32_t s) override {
    if (arena_ != nullptr) (void)arena_->Free(e.StorageAddress(s));
  }

 private:
  Arena* arena_;
};

// A registered policy without its staleness weights: the engine then takes the default route (pool walk, then
// Policy::Choose with per-candidate virtual calls; windows with a WindowCost call per block). Only used to put the
// two engine routes side by side.
class NoWeights final : public Policy {
 public:
  explicit NoWeights(std::unique_ptr<Policy> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  PolicyFeatures features() const override { return inner_->features(); }
  double Score(const StorageView& v, StorageId s) const override { return inner_->Score(v, s); }
  bool UsesWindows() const override { return inner_->UsesWindows(); }
  std::optional<double> WindowCost(const StorageView& v, StorageId s) const override {
    return inner_->WindowCost(v, s);
  }

 private:
  std::unique_ptr<Policy> inner_;
};

struct Setup {
  Setup(const std::string& name, int chain, Arena* arena_ptr, bool virtual_path = false) : executor(arena_ptr) {
    policy = *MakePolicy(name);
    if (virtual_path) policy = std::make_unique<NoWeights>(std::move(policy));
    EngineOptions o;
    o.policy = policy.get();
    o.arena = arena_ptr;
    o.mode = arena_ptr != nullptr ? AccountingMode::kArena : AccountingMode::kCounter;
    engine = std::make_unique<Engine>(o, &executor);
    TensorId prev = *engine->Constant(1024);
    OutputSpec out{1024, -1};
    std::vector<TensorId> all;
    for (int i = 0; i < chain; ++i) {
      prev = (*engine->Call(std::vector<TensorId>{prev}, {&out, 1}, 1000 + (i * 7919) % 5000, "op"))[0];
      all.push_back(prev);
    }
    // Age everything so staleness is positive, then evict every other storage.
    (void)engine->Call(std::vector<TensorId>{}, {}, 100000, "tick");
    for (std::size_t i = 0; i + 1 < all.size(); i += 2) (void)engine->Evict(engine->StorageOf(all[i]));
    for (StorageIndex s : engine->PoolOrder()) candidates.push_back(s);
  }
  std::unique_ptr<Policy> policy;
  NullExecutor executor;
  std::unique_ptr<Engine> engine;
  std::vector<StorageId> candidates;
};

void BM_Choose(benchmark::State& state, std::string name, bool sample) {
  Setup setup(name, 20000, nullptr);
  std::mt19937_64 rng(1);
  ChooseOptions options;
  options.sample_sqrt = sample;
  std::int64_t evaluations = 0;
  ChooseContext ctx{&rng, &evaluations};
  for (auto _ : state) {
    std::optional<std::size_t> pick = setup.policy->Choose(setup.engine->view(), setup.candidates, options, ctx);
    benchmark::DoNotOptimize(pick);
  }
  state.counters["candidates"] = static_cast<double>(setup.candidates.size());
  state.counters["evals/choice"] = static_cast<double>(evaluations) / static_cast<double>(state.iterations());
}

// The engine's own choice (Engine::PickVictim): what MakeRoom does under pressure, including building the candidate
// list from the pool, through the engine's dense scan when the policy has staleness weights (dtr-eq, dtr-local).
// BM_Choose above is the
// per-candidate virtual-call path over a prebuilt candidate list: the two side by side give the ratio.
void BM_EngineChoose(benchmark::State& state, std::string name, bool virtual_path) {
  Setup setup(name, 20000, nullptr, virtual_path);
  std::int64_t before = setup.engine->stats().heuristic_evaluations;
  for (auto _ : state) {
    std::optional<StorageIndex> pick = setup.engine->PickVictim();
    benchmark::DoNotOptimize(pick);
  }
  state.counters["candidates"] = static_cast<double>(setup.candidates.size());
  state.counters["evals/choice"] = static_cast<double>(setup.engine->stats().heuristic_evaluations - before) /
                                   static_cast<double>(state.iterations());
}

// Choice after a state change, as in a run under pressure: each iteration picks the victim, evicts it, brings it
// back (replaying its evicted input) and evicts that input again, so the graph keeps its shape. Times the whole
// iteration; the eq-class sums cached by the engine are invalidated by the evictions and replays.
void BM_EngineChooseAfterChange(benchmark::State& state, std::string name, bool virtual_path) {
  Setup setup(name, 20000, nullptr, virtual_path);
  Engine& e = *setup.engine;
  for (auto _ : state) {
    std::optional<StorageIndex> pick = e.PickVictim();
    if (!pick) {
      state.SkipWithError("no victim");
      break;
    }
    std::vector<StorageIndex> evicted_inputs;
    for (TensorId in : e.OpInputs(e.ProducerOf(e.StorageRoot(*pick)))) {
      if (!e.Resident(e.StorageOf(in))) evicted_inputs.push_back(e.StorageOf(in));
    }
    (void)e.Evict(*pick);
    (void)e.Rematerialize(e.StorageRoot(*pick));
    for (StorageIndex s : evicted_inputs) (void)e.Evict(s);
  }
}

void BM_CoopWindow(benchmark::State& state) {
  ArenaOptions ao;
  ao.capacity = std::size_t{20001} * 1024 + 4096;
  ao.alignment = 512;
  std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), ao);
  Setup setup("coop", 20000, arena.get());
  const Policy& policy = *setup.policy;
  const StorageView& view = setup.engine->view();
  std::size_t blocks = 0;
  arena->ForEachBlock([&](const BlockInfo&) { ++blocks; });
  for (auto _ : state) {
    std::optional<Window> w = arena->FindWindow(8 * 1024, [&](const BlockInfo& b) -> std::optional<double> {
      return policy.WindowCost(view, b.owner - 1);
    });
    benchmark::DoNotOptimize(w);
  }
  state.counters["blocks"] = static_cast<double>(blocks);
}

// The arena's window search alone: every owned block costs 1, so this is the floor under any window policy.
void BM_ArenaWindowRaw(benchmark::State& state) {
  ArenaOptions ao;
  ao.capacity = std::size_t{20001} * 1024 + 4096;
  ao.alignment = 512;
  std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), ao);
  Setup setup("coop", 20000, arena.get());
  for (auto _ : state) {
    std::optional<Window> w = arena->FindWindow(8 * 1024, [&](const BlockInfo& b) -> std::optional<double> {
      if (b.owner == kNoOwner) return std::nullopt;
      return 1.0;
    });
    benchmark::DoNotOptimize(w);
  }
}

// The same window search through the engine (Engine::PickWindow, what MakeRoom does under pressure): window costs
// precomputed from the engine's dense arrays, or (/virtual) a WindowCost call per block.
void BM_EngineCoopWindow(benchmark::State& state, bool virtual_path) {
  ArenaOptions ao;
  ao.capacity = std::size_t{20001} * 1024 + 4096;
  ao.alignment = 512;
  std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), ao);
  Setup setup("coop", 20000, arena.get(), virtual_path);
  std::optional<Window> first = setup.engine->PickWindow(8 * 1024);
  if (!first || first->owners.empty()) {
    state.SkipWithError("no window");
    return;
  }
  for (auto _ : state) {
    std::optional<Window> w = setup.engine->PickWindow(8 * 1024);
    benchmark::DoNotOptimize(w);
  }
  state.counters["owners"] = static_cast<double>(first->owners.size());
}

// Pass 1 of the engine's dense scan alone over 10k slots, per variant: four AVX2 lanes (what this CPU runs when
// it has AVX2) and two lanes (the baseline build's SSE2, what a CPU without AVX2 runs).
void BM_DenseScanPass1(benchmark::State& state, bool four_lanes) {
  if (four_lanes && !CpuHasAvx2()) {
    state.SkipWithError("no AVX2");
    return;
  }
  std::mt19937_64 rng(1);
  const std::size_t n = 10000;
  std::vector<double> weight(n), last(n), chunk_min(n / kScanChunk + 1);
  for (std::size_t i = 0; i < n; ++i) {
    weight[i] = static_cast<double>(1000 + rng() % 5000) / 1024.0;
    last[i] = static_cast<double>(rng() % 100000);
  }
  double clock = 200000;
  for (auto _ : state) {
    double m = four_lanes ? ChunkMinimaFourLanes(weight.data(), last.data(), n, clock, chunk_min.data())
                          : ChunkMinimaTwoLanes(weight.data(), last.data(), n, clock, chunk_min.data());
    benchmark::DoNotOptimize(m);
    clock += 1;
  }
}

void Register() {
  for (const std::string& name : PolicyNames()) {
    benchmark::RegisterBenchmark(("BM_Choose/" + name).c_str(), BM_Choose, name, false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_Choose/" + name + "/sqrt").c_str(), BM_Choose, name, true)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const char* name : {"dtr-eq", "dtr-local", "dtr"}) {
    benchmark::RegisterBenchmark((std::string("BM_EngineChoose/") + name).c_str(), BM_EngineChoose,
                                 std::string(name), false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("BM_EngineChoose/") + name + "/virtual").c_str(), BM_EngineChoose,
                                 std::string(name), true)
        ->Unit(benchmark::kMicrosecond);
  }
  for (bool virtual_path : {false, true}) {
    benchmark::RegisterBenchmark(virtual_path ? "BM_EngineChooseAfterChange/dtr-eq/virtual"
                                          : "BM_EngineChooseAfterChange/dtr-eq",
                                 BM_EngineChooseAfterChange, std::string("dtr-eq"), virtual_path)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("BM_CoopWindow/10k_blocks", BM_CoopWindow)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_EngineDenseScanPass1/10k/four_lanes", BM_DenseScanPass1, true)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_EngineDenseScanPass1/10k/two_lanes", BM_DenseScanPass1, false)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_ArenaWindowRaw/10k_blocks", BM_ArenaWindowRaw)->Unit(benchmark::kMicrosecond);
  for (bool virtual_path : {false, true}) {
    benchmark::RegisterBenchmark(
        virtual_path ? "BM_EngineCoopWindow/10k_blocks/virtual" : "BM_EngineCoopWindow/10k_blocks",
        BM_EngineCoopWindow, virtual_path)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace remat

int main(int argc, char** argv) {
  remat::Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
