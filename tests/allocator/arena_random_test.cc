// Randomized test of the arena against a reference model.
//
// The model is a std::map of allocated intervals (address -> size, owner) over one segment. Every allocation is
// predicted from it: the smallest hole that fits, the lowest such hole on ties, at its low or high end; so the
// arena must return exactly that address, or fail exactly when no hole fits. After every operation the arena's
// block list must tile the segment in address order with aligned blocks, hold exactly the model's allocated
// blocks (address, size, owner), never show two adjacent free blocks (complete coalescing), and report exact
// stats. Every few operations FindWindow is compared with a brute-force search over the block list, with random
// costs and barriers.
//
// A second test runs a growing arena (several segments) and checks the same invariants segment by segment, and
// that windows never cross a segment boundary.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "allocator/arena.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

struct Live {
  std::size_t size;
  OwnerId owner;
};

std::vector<BlockInfo> Blocks(const Arena& arena) {
  std::vector<BlockInfo> out;
  arena.ForEachBlock([&](const BlockInfo& b) { out.push_back(b); });
  return out;
}

// Brute force over all runs [i, j]: the smallest cost, then the lowest end, then the highest start. Runs end at
// a barrier or a segment boundary (two blocks are in one segment iff they touch: the virtual provider leaves a gap
// between segments). From a fixed start only the shortest run that holds the request can win, so j stops there.
std::optional<Window> BruteForceWindow(const std::vector<BlockInfo>& blocks, std::size_t aligned,
                                       const std::function<std::optional<double>(const BlockInfo&)>& cost) {
  std::optional<Window> best;
  std::uintptr_t best_end = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    std::size_t size = 0;
    double sum = 0;
    for (std::size_t j = i; j < blocks.size(); ++j) {
      if (j > i && blocks[j - 1].address + blocks[j - 1].size != blocks[j].address) break;
      if (!blocks[j].free) {
        std::optional<double> c = cost(blocks[j]);
        if (!c.has_value()) break;
        sum += std::max(*c, 0.0);
      }
      size += blocks[j].size;
      if (size < aligned) continue;
      const std::uintptr_t end = blocks[j].address + blocks[j].size;
      const bool better =
          !best.has_value() || sum < best->cost ||
          (sum == best->cost && (end < best_end || (end == best_end && blocks[i].address > best->address)));
      if (better) {
        Window w;
        w.address = blocks[i].address;
        w.size = size;
        w.cost = sum;
        for (std::size_t k = i; k <= j; ++k) {
          if (!blocks[k].free) w.owners.push_back(blocks[k].owner);
        }
        best = std::move(w);
        best_end = end;
      }
      break;
    }
  }
  return best;
}

class RandomCosts {
 public:
  enum Kind { kInteger, kFractional, kWide };
  // Integer costs (exact in floating point) with many zeros and ties; fractional ones; or fractional ones
  // spread over 18 orders of magnitude, where a running sum loses the small ones next to the large ones. The
  // table has 64 entries, so owners share costs and exact ties are common in every kind.
  RandomCosts(std::mt19937_64& rng, Kind kind) : table_(64) {
    std::uniform_int_distribution<int> pick(0, 99);
    const int barrier_percent = std::uniform_int_distribution<int>(0, 30)(rng);
    for (auto& c : table_) {
      if (pick(rng) < barrier_percent) {
        c = std::nullopt;
      } else if (kind == kFractional) {
        c = std::uniform_real_distribution<double>(0, 1000)(rng);
      } else if (kind == kWide) {
        c = std::pow(10.0, std::uniform_real_distribution<double>(-6, 12)(rng));
      } else {
        c = static_cast<double>(std::uniform_int_distribution<int>(0, 5)(rng));
      }
    }
  }
  std::optional<double> operator()(const BlockInfo& b) const { return table_[b.owner % table_.size()]; }

 private:
  std::vector<std::optional<double>> table_;
};

// Costs are compared exactly: the arena compares windows on sums taken in address order, as the brute force does.
void ExpectSameWindow(const std::optional<Window>& got, const std::optional<Window>& want) {
  ASSERT_EQ(got.has_value(), want.has_value());
  if (!got.has_value()) return;
  EXPECT_EQ(got->address, want->address);
  EXPECT_EQ(got->size, want->size);
  EXPECT_EQ(got->owners, want->owners);
  EXPECT_EQ(got->cost, want->cost);
}

struct Config {
  std::size_t alignment;
  std::size_t units;      // capacity in alignment units
  std::size_t max_units;  // largest request in units
  int ops;
  std::uint64_t seed;
};

class ArenaRandomTest : public ::testing::TestWithParam<Config> {};

TEST_P(ArenaRandomTest, MatchesTheReferenceModel) {
  const Config cfg = GetParam();
  const std::size_t a = cfg.alignment;
  ArenaOptions options;
  options.capacity = cfg.units * a;
  options.alignment = a;
  auto arena = *Arena::Create(MakeVirtualProvider(), options);
  const std::uintptr_t base = Blocks(*arena).front().address;
  const std::uintptr_t end = base + cfg.units * a;

  std::mt19937_64 rng(cfg.seed);
  std::map<std::uintptr_t, Live> model;
  std::size_t allocated = 0, peak = 0;
  std::uint64_t allocations = 0, frees = 0;
  std::vector<std::uintptr_t> live;  // the model's keys, for picking a random one
  int windows_checked = 0, failed_allocations = 0, moves = 0;

  for (int op = 0; op < cfg.ops; ++op) {
    const int kind = std::uniform_int_distribution<int>(0, 99)(rng);
    // Drift the occupancy: allocate more often while fewer than 40 blocks are live.
    const int alloc_percent = live.size() < 40 ? 60 : 45;
    if (kind < alloc_percent) {
      // Sizes in bytes, not units: exercise rounding (and 0).
      const std::size_t units = 1 + std::uniform_int_distribution<std::size_t>(0, cfg.max_units - 1)(rng) *
                                        std::uniform_int_distribution<std::size_t>(0, 1)(rng);
      std::size_t bytes = units * a - std::uniform_int_distribution<std::size_t>(0, a - 1)(rng);
      if (std::uniform_int_distribution<int>(0, 50)(rng) == 0) bytes = 0;
      const std::size_t aligned = std::max<std::size_t>(a, (bytes + a - 1) / a * a);
      const Placement placement = std::array{Placement::kLow, Placement::kHigh, Placement::kTop}[rng() % 3];
      const OwnerId owner = rng() % 1000;
      // The model's prediction: smallest hole that fits, lowest address on ties; for kTop the highest hole that
      // fits.
      std::optional<std::pair<std::size_t, std::uintptr_t>> hole;  // (size, start)
      std::uintptr_t cursor = base;
      auto consider = [&](std::uintptr_t lo, std::uintptr_t hi) {
        const std::size_t size = hi - lo;
        if (size < aligned) return;
        if (placement == Placement::kTop ? (!hole || lo > hole->second) : (!hole || size < hole->first)) {
          hole = {size, lo};
        }
      };
      for (const auto& [addr, blk] : model) {
        consider(cursor, addr);
        cursor = addr + blk.size;
      }
      consider(cursor, end);
      absl::StatusOr<std::uintptr_t> got =
          (rng() & 1) ? arena->Allocate(bytes, owner, placement) : arena->TryAllocate(bytes, owner, placement);
      if (!hole) {
        ASSERT_FALSE(got.ok()) << "op " << op << ": arena placed " << aligned << " bytes the model cannot";
        ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
        ++failed_allocations;
      } else {
        ASSERT_TRUE(got.ok()) << "op " << op << ": " << got.status();
        const std::uintptr_t want =
            placement == Placement::kLow ? hole->second : hole->second + hole->first - aligned;
        ASSERT_EQ(*got, want) << "op " << op;
        model[*got] = Live{aligned, owner};
        live.push_back(*got);
        allocated += aligned;
        peak = std::max(peak, allocated);
        ++allocations;
      }
    } else if (kind < 90) {
      if (live.empty()) continue;
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      const std::uintptr_t addr = live[k];
      ASSERT_TRUE(arena->Free(addr).ok()) << "op " << op;
      allocated -= model[addr].size;
      model.erase(addr);
      live[k] = live.back();
      live.pop_back();
      ++frees;
      if (std::uniform_int_distribution<int>(0, 20)(rng) == 0) {
        ASSERT_FALSE(arena->Free(addr).ok()) << "double free accepted";
      }
    } else if (kind < 95) {
      if (live.empty()) continue;
      const std::uintptr_t addr = live[std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng)];
      const OwnerId owner = rng() % 1000;
      ASSERT_TRUE(arena->SetOwner(addr, owner).ok());
      model[addr].owner = owner;
    } else {
      // Move a block within the range it would free: the model's previous block's end to the next one's start.
      if (live.empty()) continue;
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      const std::uintptr_t addr = live[k];
      auto at = model.find(addr);
      const std::uintptr_t lo = at == model.begin() ? base : std::prev(at)->first + std::prev(at)->second.size;
      const std::uintptr_t hi = std::next(at) == model.end() ? end : std::next(at)->first;
      const std::size_t size = at->second.size;
      if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) {  // just out of range, or misaligned
        const std::uintptr_t bad = (rng() & 1) ? hi - size + a : addr + a / 2;
        ASSERT_EQ(arena->Move(addr, bad).code(), absl::StatusCode::kInvalidArgument) << "op " << op;
      } else {
        const std::uintptr_t to = lo + std::uniform_int_distribution<std::size_t>(0, (hi - size - lo) / a)(rng) * a;
        ASSERT_TRUE(arena->Move(addr, to).ok()) << "op " << op;
        const Live moved = at->second;
        model.erase(at);
        model[to] = moved;
        live[k] = to;
        moves += to != addr;
      }
    }

    // Invariants after every operation.
    const std::vector<BlockInfo> blocks = Blocks(*arena);
    std::uintptr_t cursor = base;
    std::size_t free_blocks = 0, free_bytes = 0, largest = 0, allocated_seen = 0;
    bool prev_free = false;
    auto it = model.begin();
    for (const BlockInfo& b : blocks) {
      ASSERT_EQ(b.address, cursor) << "op " << op << ": gap or overlap";
      ASSERT_GT(b.size, 0u);
      ASSERT_EQ(b.address % a, 0u);
      ASSERT_EQ(b.size % a, 0u);
      if (b.free) {
        ASSERT_FALSE(prev_free) << "op " << op << ": two adjacent free blocks at " << b.address;
        ++free_blocks;
        free_bytes += b.size;
        largest = std::max(largest, b.size);
      } else {
        ASSERT_NE(it, model.end()) << "op " << op << ": block the model does not have";
        ASSERT_EQ(b.address, it->first);
        ASSERT_EQ(b.size, it->second.size);
        ASSERT_EQ(b.owner, it->second.owner);
        ++it;
        allocated_seen += b.size;
      }
      prev_free = b.free;
      cursor += b.size;
    }
    ASSERT_EQ(cursor, end);
    ASSERT_EQ(it, model.end()) << "op " << op << ": the arena lost a block";
    ASSERT_EQ(allocated_seen, allocated);
    const ArenaStats st = arena->Stats();
    ASSERT_EQ(st.allocated_bytes, allocated);
    ASSERT_EQ(st.reserved_bytes, cfg.units * a);
    ASSERT_EQ(st.peak_allocated_bytes, peak);
    ASSERT_EQ(st.free_blocks, free_blocks);
    ASSERT_EQ(st.free_bytes, free_bytes);
    ASSERT_EQ(st.largest_free_block, largest);
    ASSERT_EQ(st.allocations, allocations);
    ASSERT_EQ(st.frees, frees);
    ASSERT_EQ(st.moves, static_cast<std::uint64_t>(moves));
    ASSERT_EQ(st.pressure_allocations, 0u);

    if (op % 16 == 0) {
      const int mode = (op / 16) % 4;
      RandomCosts costs(rng, mode == 0   ? RandomCosts::kFractional
                             : mode == 1 ? RandomCosts::kWide
                                         : RandomCosts::kInteger);
      const std::size_t want_units =
          1 + std::uniform_int_distribution<std::size_t>(0, cfg.units / 2)(rng) *
                  std::uniform_int_distribution<std::size_t>(0, 1)(rng);
      const std::size_t aligned = want_units * a;
      auto fn = [&](const BlockInfo& b) { return costs(b); };
      ExpectSameWindow(arena->FindWindow(aligned, fn), BruteForceWindow(blocks, aligned, fn));
      // And the window is usable: its blocks are contiguous, hold the request, and contain no barrier.
      if (auto w = arena->FindWindow(aligned - a + 1, fn)) {
        ASSERT_GE(w->size, aligned);
        for (OwnerId o : w->owners) ASSERT_TRUE(costs(BlockInfo{0, 0, o, false}).has_value());
      }
      ++windows_checked;
      if (::testing::Test::HasFailure()) FAIL() << "op " << op;
    }
  }
  // The test must have exercised what it claims to.
  EXPECT_GT(windows_checked, cfg.ops / 20);
  EXPECT_GT(failed_allocations, 0);
  EXPECT_GT(moves, cfg.ops / 200);  // a block with no free neighbour can only stay put
  EXPECT_GT(allocations, static_cast<std::uint64_t>(cfg.ops / 4));
}

INSTANTIATE_TEST_SUITE_P(Layouts, ArenaRandomTest,
                         ::testing::Values(Config{512, 256, 24, 100000, 1}, Config{64, 512, 40, 100000, 2},
                                           Config{512, 96, 8, 100000, 3}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return "align" + std::to_string(info.param.alignment) + "_units" +
                                  std::to_string(info.param.units);
                         });

// A growing arena: several segments. The same structural invariants hold per segment, stats stay exact, and
// windows (checked against brute force, which splits at segment gaps) never cross a segment boundary.
TEST(ArenaRandomGrowTest, SegmentsStayIndependent) {
  constexpr std::size_t a = 512;
  ArenaOptions options;
  options.alignment = a;
  options.grow = true;
  options.growth_limit = std::size_t{16} << 20;
  auto arena = *Arena::Create(MakeVirtualProvider(), options);
  std::mt19937_64 rng(7);
  std::map<std::uintptr_t, Live> model;
  std::vector<std::uintptr_t> live;
  std::size_t allocated = 0;
  for (int op = 0; op < 30000; ++op) {
    if ((rng() % 100) < (allocated < (std::size_t{12} << 20) ? 60u : 40u)) {
      const std::size_t bytes = 1 + rng() % (std::size_t{1} << 19);
      auto got = arena->Allocate(bytes, rng() % 64, (rng() & 1) ? Placement::kLow : Placement::kHigh);
      if (!got.ok()) continue;
      const std::size_t aligned = (bytes + a - 1) / a * a;
      // No overlap with the model's blocks.
      auto next = model.lower_bound(*got);
      if (next != model.end()) {
        ASSERT_GE(next->first, *got + aligned);
      }
      if (next != model.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second.size, *got);
      }
      model[*got] = Live{aligned, 0};
      live.push_back(*got);
      allocated += aligned;
    } else if (!live.empty()) {
      const std::size_t k = rng() % live.size();
      allocated -= model[live[k]].size;
      ASSERT_TRUE(arena->Free(live[k]).ok());
      model.erase(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    if (op % 64 != 0) continue;
    const std::vector<BlockInfo> blocks = Blocks(*arena);
    std::size_t free_bytes = 0, free_blocks = 0, total = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      total += blocks[i].size;
      if (blocks[i].free) {
        free_bytes += blocks[i].size;
        ++free_blocks;
      }
      if (i > 0) {
        ASSERT_GT(blocks[i].address, blocks[i - 1].address);
      }
      const bool touches = i > 0 && blocks[i - 1].address + blocks[i - 1].size == blocks[i].address;
      if (touches) {
        ASSERT_FALSE(blocks[i].free && blocks[i - 1].free) << "uncoalesced at op " << op;
      }
    }
    const ArenaStats st = arena->Stats();
    ASSERT_EQ(st.allocated_bytes, allocated);
    ASSERT_EQ(st.reserved_bytes, total);
    ASSERT_EQ(st.free_bytes, free_bytes);
    ASSERT_EQ(st.free_blocks, free_blocks);
    ASSERT_LE(st.reserved_bytes, options.growth_limit);
    RandomCosts costs(rng, (op / 64) % 2 ? RandomCosts::kWide : RandomCosts::kInteger);
    auto fn = [&](const BlockInfo& b) { return costs(b); };
    const std::size_t want = a * (1 + rng() % 4096);
    ExpectSameWindow(arena->FindWindow(want, fn), BruteForceWindow(blocks, want, fn));
    if (::testing::Test::HasFailure()) FAIL() << "op " << op;
  }
  EXPECT_GT(arena->Stats().reserved_bytes, std::size_t{4} << 20);  // it did grow into several segments
}

}  // namespace
}  // namespace remat
