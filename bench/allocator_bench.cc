// Allocator benchmarks: the arena's allocate+free pair against glibc malloc/free in the same run, and the window
// search.
//
//   build/bench/allocator_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Pair: N blocks are live (N = 1k, 10k, 100k); each iteration frees a random live block and allocates a new one
// in its slot, so the live set stays at N. Sizes are log-uniform between 64 B and 64 KiB, alignment 64 (the CPU
// path). The sizes, victims and the initial live set come from one seeded generator and are identical for the
// arena and for glibc; the random numbers are drawn before timing. The arena runs over the virtual provider
// (the arena never touches the memory it places, so a host provider would measure the same code) with twice the
// live bytes as capacity; glibc's malloc/free are called through function pointers so neither side is inlined
// away. Target: arena pair median within 2x of glibc at 10k live blocks.
//
// Window: an arena tiled by N blocks (N = 10k, 100k) of the same sizes, a fifth of them freed (and coalesced),
// 5% of the rest barriers, the request 64 mean block sizes. The cost callback is a table lookup by owner, so the
// figure is the arena's pass plus one indirect call per allocated block; a policy's cost function adds its own
// time. Target: under 50 us at 10k blocks.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "allocator/arena.h"

namespace remat {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kMinSize = 64;
constexpr std::size_t kMaxSize = 64 << 10;
constexpr std::size_t kSteps = 1 << 16;  // pre-drawn (size, victim) pairs, cycled

std::size_t DrawSize(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(std::log(double{kMinSize}), std::log(double{kMaxSize}));
  return static_cast<std::size_t>(std::exp(u(rng)));
}

struct Workload {
  std::vector<std::size_t> initial;  // sizes of the initial live set
  std::vector<std::size_t> sizes;    // per step: size of the new block
  std::vector<std::size_t> victims;  // per step: slot to free and refill
  std::size_t live_bytes = 0;
};

Workload MakeWorkload(std::size_t live) {
  std::mt19937_64 rng(42 + live);
  Workload w;
  for (std::size_t i = 0; i < live; ++i) {
    w.initial.push_back(DrawSize(rng));
    w.live_bytes += w.initial.back();
  }
  std::uniform_int_distribution<std::size_t> slot(0, live - 1);
  for (std::size_t i = 0; i < kSteps; ++i) {
    w.sizes.push_back(DrawSize(rng));
    w.victims.push_back(slot(rng));
  }
  return w;
}

void BM_ArenaPair(benchmark::State& state) {
  const std::size_t live = static_cast<std::size_t>(state.range(0));
  const Workload w = MakeWorkload(live);
  ArenaOptions options;
  options.alignment = kAlignment;
  options.capacity = 2 * (w.live_bytes + live * kAlignment);
  auto arena = *Arena::Create(MakeVirtualProvider(), options);
  std::vector<std::uintptr_t> slots(live);
  for (std::size_t i = 0; i < live; ++i) slots[i] = *arena->Allocate(w.initial[i], i + 1);
  std::size_t step = 0;
  for (auto _ : state) {
    const std::size_t v = w.victims[step];
    if (!arena->Free(slots[v]).ok()) state.SkipWithError("free failed");
    auto a = arena->Allocate(w.sizes[step], v + 1);
    if (!a.ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    slots[v] = *a;
    step = (step + 1) & (kSteps - 1);
  }
  const ArenaStats st = arena->Stats();
  state.counters["free_blocks"] = static_cast<double>(st.free_blocks);
  state.counters["search_ns_per_pair"] =
      static_cast<double>(st.search_ns) / static_cast<double>(std::max<std::uint64_t>(1, st.allocations));
}

void* (*volatile glibc_malloc)(std::size_t) = &std::malloc;
void (*volatile glibc_free)(void*) = &std::free;

void BM_GlibcPair(benchmark::State& state) {
  const std::size_t live = static_cast<std::size_t>(state.range(0));
  const Workload w = MakeWorkload(live);
  std::vector<void*> slots(live);
  for (std::size_t i = 0; i < live; ++i) slots[i] = glibc_malloc(w.initial[i]);
  std::size_t step = 0;
  for (auto _ : state) {
    const std::size_t v = w.victims[step];
    glibc_free(slots[v]);
    slots[v] = glibc_malloc(w.sizes[step]);
    benchmark::DoNotOptimize(slots[v]);
    step = (step + 1) & (kSteps - 1);
  }
  for (void* p : slots) glibc_free(p);
}

void BM_FindWindow(benchmark::State& state) {
  const std::size_t blocks = static_cast<std::size_t>(state.range(0));
  const Workload w = MakeWorkload(blocks);
  ArenaOptions options;
  options.alignment = kAlignment;
  options.capacity = w.live_bytes + blocks * kAlignment;
  auto arena = *Arena::Create(MakeVirtualProvider(), options);
  std::vector<std::uintptr_t> slots(blocks);
  for (std::size_t i = 0; i < blocks; ++i) slots[i] = *arena->Allocate(w.initial[i], i + 1);
  std::mt19937_64 rng(7);
  std::vector<std::optional<double>> cost(blocks + 1);  // by owner; nullopt marks a barrier
  for (std::size_t i = 0; i < blocks; ++i) {
    const int roll = static_cast<int>(rng() % 100);
    if (roll < 20) {
      (void)arena->Free(slots[i]);
    } else if (roll >= 25) {
      cost[i + 1] = std::uniform_real_distribution<double>(0.001, 1.0)(rng);
    }
  }
  const std::size_t request = 64 * (w.live_bytes / blocks);
  std::size_t found = 0;
  for (auto _ : state) {
    auto win = arena->FindWindow(request, [&](const BlockInfo& b) { return cost[b.owner]; });
    found += win.has_value();
    benchmark::DoNotOptimize(win);
  }
  if (found == 0) state.SkipWithError("no window found");
  std::size_t n = 0;
  arena->ForEachBlock([&](const BlockInfo&) { ++n; });
  state.counters["blocks"] = static_cast<double>(n);
}

// The same layout with every evictable block costing 1: every window of as many blocks ties, the case where a
// careless exact-tie rule would re-sum every window.
void BM_FindWindowEqualCosts(benchmark::State& state) {
  const std::size_t blocks = static_cast<std::size_t>(state.range(0));
  const Workload w = MakeWorkload(blocks);
  ArenaOptions options;
  options.alignment = kAlignment;
  options.capacity = w.live_bytes + blocks * kAlignment;
  auto arena = *Arena::Create(MakeVirtualProvider(), options);
  std::vector<std::uintptr_t> slots(blocks);
  for (std::size_t i = 0; i < blocks; ++i) slots[i] = *arena->Allocate(w.initial[i], i + 1);
  std::mt19937_64 rng(7);
  std::vector<std::optional<double>> cost(blocks + 1);
  for (std::size_t i = 0; i < blocks; ++i) {
    const int roll = static_cast<int>(rng() % 100);
    if (roll < 20) {
      (void)arena->Free(slots[i]);
    } else if (roll >= 25) {
      cost[i + 1] = 1.0;
    }
  }
  const std::size_t request = 64 * (w.live_bytes / blocks);
  for (auto _ : state) {
    auto win = arena->FindWindow(request, [&](const BlockInfo& b) { return cost[b.owner]; });
    benchmark::DoNotOptimize(win);
  }
}

BENCHMARK(BM_ArenaPair)->Arg(1000)->Arg(10000)->Arg(100000);
BENCHMARK(BM_GlibcPair)->Arg(1000)->Arg(10000)->Arg(100000);
BENCHMARK(BM_FindWindow)->Arg(10000)->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FindWindowEqualCosts)->Arg(10000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace remat

BENCHMARK_MAIN();
