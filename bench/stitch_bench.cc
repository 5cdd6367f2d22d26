// Mapping cost of the stitching arena on the CPU (issue 18, item 3): one allocate + touch + free of a block, with
// the stitching provider (private memory mapped granule by granule, kept by freed granules until another range
// needs it) against the contiguous arena over host memory (no system call), in the same run. Each iteration writes one
// byte per page of the block, so the stitched block's page faults are counted (the contiguous arena's pages stay
// faulted in after the first iteration: that is the difference a user pays).
//
//   build/bench/stitch_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Arguments: block size in KiB, granule in KiB (0: the contiguous arena). Half the pool is held by other blocks
// spread over the address space (one granule each), so that blocks are stitched from non-adjacent granules; freed
// granules stay mapped, so this is the steady state of a training loop that frees and allocates the same sizes.
// BM_RemapEveryAllocation is the worst case, where every granule of every allocation is remapped.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "allocator/arena.h"
#include "allocator/memory_provider.h"

namespace remat {
namespace {

void BM_AllocateTouchFree(benchmark::State& state) {
  const std::size_t block = static_cast<std::size_t>(state.range(0)) << 10;
  const std::size_t granule = static_cast<std::size_t>(state.range(1)) << 10;
  const std::size_t pool = 4 * block + 64 * std::max<std::size_t>(granule, 64 << 10);
  ArenaOptions o;
  o.alignment = 64;
  std::unique_ptr<MemoryProvider> provider;
  if (granule == 0) {
    o.capacity = pool;
    provider = MakeHostProvider();
  } else {
    o.capacity = 8 * pool;
    o.granule = granule;
    o.physical_limit = pool;
    provider = *MakeStitchHostProvider(pool, granule);
  }
  std::unique_ptr<Arena> arena = *Arena::Create(std::move(provider), o);
  // Other blocks, every other one freed: the free granules are scattered.
  const std::size_t filler = std::max<std::size_t>(granule, 64 << 10);
  std::vector<std::uintptr_t> held;
  for (int i = 0; i < 64; ++i) held.push_back(*arena->TryAllocate(filler, 1000 + i));
  for (int i = 0; i < 64; i += 2) (void)arena->Free(held[i]);
  const long page = sysconf(_SC_PAGESIZE);
  for (auto _ : state) {
    absl::StatusOr<std::uintptr_t> a = arena->TryAllocate(block, 1);
    if (!a.ok()) {
      state.SkipWithError(std::string(a.status().message()).c_str());
      break;
    }
    char* p = reinterpret_cast<char*>(*a);
    for (std::size_t off = 0; off < block; off += static_cast<std::size_t>(page)) p[off] = 1;
    benchmark::DoNotOptimize(p[0]);
    (void)arena->Free(*a);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(block));
}

// The worst case: every allocation lands on a virtual range whose granules are not mapped, and the pool has no
// free granule, so each granule's memory is taken from an unused mapping elsewhere (given back there, fresh zeroed
// memory mapped here with MAP_POPULATE). The provider alone, alternating two ranges of one pool's size.
void BM_RemapEveryAllocation(benchmark::State& state) {
  const std::size_t block = static_cast<std::size_t>(state.range(0)) << 10;
  const std::size_t granule = static_cast<std::size_t>(state.range(1)) << 10;
  std::unique_ptr<MemoryProvider> provider = *MakeStitchHostProvider(block, granule);
  const Segment segment = *provider->Reserve(2 * block, granule);
  const long page = sysconf(_SC_PAGESIZE);
  std::uintptr_t range = segment.base;
  for (auto _ : state) {
    range = range == segment.base ? segment.base + block : segment.base;
    if (absl::Status s = provider->Map(range, block); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    char* p = reinterpret_cast<char*>(range);
    for (std::size_t off = 0; off < block; off += static_cast<std::size_t>(page)) p[off] = 1;
    benchmark::DoNotOptimize(p[0]);
    provider->Unmap(range, block);
  }
  provider->Release(segment);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(block));
}

BENCHMARK(BM_RemapEveryAllocation)
    ->ArgNames({"block_KiB", "granule_KiB"})
    ->Args({256, 64})->Args({4096, 64})->Args({4096, 2048})->Args({65536, 64})->Args({65536, 2048})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_AllocateTouchFree)
    ->ArgNames({"block_KiB", "granule_KiB"})
    ->Args({256, 0})->Args({256, 64})->Args({256, 2048})
    ->Args({4096, 0})->Args({4096, 64})->Args({4096, 2048})
    ->Args({65536, 0})->Args({65536, 64})->Args({65536, 2048})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace remat

BENCHMARK_MAIN();
