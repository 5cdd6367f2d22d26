// Unit tests for the arena's contract (allocator/arena.h): placement, splitting, coalescing, owners, window
// search on hand-built layouts, the pressure hook, stats, growth and concurrent use.
#include "allocator/arena.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::size_t kA = 512;

std::unique_ptr<Arena> MakeArena(std::size_t capacity, std::size_t alignment = kA) {
  ArenaOptions options;
  options.capacity = capacity;
  options.alignment = alignment;
  auto arena = Arena::Create(MakeVirtualProvider(), options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return std::move(*arena);
}

std::vector<BlockInfo> Blocks(const Arena& arena) {
  std::vector<BlockInfo> out;
  arena.ForEachBlock([&](const BlockInfo& b) { out.push_back(b); });
  return out;
}

std::uintptr_t Base(const Arena& arena) { return Blocks(arena).front().address; }

TEST(ArenaTest, CreateRejectsBadOptions) {
  ArenaOptions options;
  options.alignment = 3;
  EXPECT_EQ(Arena::Create(MakeVirtualProvider(), options).status().code(), absl::StatusCode::kInvalidArgument);
  options.alignment = 0;
  EXPECT_EQ(Arena::Create(MakeVirtualProvider(), options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create(nullptr, ArenaOptions{}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ArenaTest, OneSegmentOfTheCapacityIsOneFreeBlock) {
  auto arena = MakeArena(1000 * kA + 1);  // rounded up to the alignment
  auto blocks = Blocks(*arena);
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_TRUE(blocks[0].free);
  EXPECT_EQ(blocks[0].size, 1001 * kA);
  EXPECT_EQ(blocks[0].address % kA, 0u);
  EXPECT_NE(blocks[0].address, 0u);
  ArenaStats st = arena->Stats();
  EXPECT_EQ(st.reserved_bytes, 1001 * kA);
  EXPECT_EQ(st.free_bytes, 1001 * kA);
  EXPECT_EQ(st.free_blocks, 1u);
  EXPECT_EQ(st.largest_free_block, 1001 * kA);
  EXPECT_EQ(st.allocated_bytes, 0u);
}

TEST(ArenaTest, AllocateRoundsUpAndZeroIsOneUnit) {
  auto arena = MakeArena(16 * kA);
  auto a = arena->Allocate(1, 7);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(arena->Block(*a)->size, kA);
  auto b = arena->Allocate(0, 8);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(arena->Block(*b)->size, kA);
  auto c = arena->Allocate(kA + 1, 9);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(arena->Block(*c)->size, 2 * kA);
  EXPECT_EQ(arena->Stats().allocated_bytes, 4 * kA);
  EXPECT_EQ(arena->Stats().allocations, 3u);
}

TEST(ArenaTest, LowAndHighPlacementTakeTheEndsOfTheFreeBlock) {
  auto arena = MakeArena(16 * kA);
  const std::uintptr_t base = Base(*arena);
  auto lo = arena->Allocate(kA, 1, Placement::kLow);
  auto hi = arena->Allocate(2 * kA, 2, Placement::kHigh);
  ASSERT_TRUE(lo.ok() && hi.ok());
  EXPECT_EQ(*lo, base);
  EXPECT_EQ(*hi, base + 14 * kA);
  auto lo2 = arena->Allocate(kA, 3, Placement::kLow);
  auto hi2 = arena->Allocate(kA, 4, Placement::kHigh);
  EXPECT_EQ(*lo2, base + kA);
  EXPECT_EQ(*hi2, base + 13 * kA);
  auto blocks = Blocks(*arena);
  ASSERT_EQ(blocks.size(), 5u);
  EXPECT_EQ(blocks[2].size, 11 * kA);
  EXPECT_TRUE(blocks[2].free);
}

TEST(ArenaTest, TopPlacementTakesTheHighestHoleThatFits) {
  auto arena = MakeArena(16 * kA);
  const std::uintptr_t base = Base(*arena);
  // Blocks at units 0..15: holes of 4 units at [0,4), 2 units at [6,8), 3 units at [10,13); 13..15 allocated.
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(*arena->Allocate(kA, 1));
  for (int i : {0, 1, 2, 3, 6, 7, 10, 11, 12}) ASSERT_TRUE(arena->Free(blocks[i]).ok());
  // Best fit would take the 2-unit hole for 2 units; top takes the highest hole that holds them, at its high end.
  auto top = arena->Allocate(2 * kA, 2, Placement::kTop);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(*top, base + 11 * kA);
  // 4 units fit only in the lowest hole.
  auto big = arena->Allocate(4 * kA, 3, Placement::kTop);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(*big, base);
}

TEST(ArenaTest, BestFitTakesTheSmallestHoleThenTheLowestAddress) {
  auto arena = MakeArena(64 * kA);
  const std::uintptr_t base = Base(*arena);
  // Holes of 3, 2, 2 and 4 units separated by allocated blocks.
  std::vector<std::uintptr_t> a;
  for (std::size_t units : {3, 1, 2, 1, 2, 1, 4, 1}) a.push_back(*arena->Allocate(units * kA, 1));
  for (int i : {0, 2, 4, 6}) ASSERT_TRUE(arena->Free(a[i]).ok());
  EXPECT_EQ(*arena->Allocate(2 * kA, 2), base + 4 * kA);  // the first 2-unit hole
  EXPECT_EQ(*arena->Allocate(2 * kA, 2), base + 7 * kA);  // the second
  EXPECT_EQ(*arena->Allocate(kA, 2), base);               // 3-unit hole beats 4 and the tail
  EXPECT_EQ(*arena->Allocate(4 * kA, 2), base + 10 * kA);
}

TEST(ArenaTest, FreeCoalescesWithBothNeighbours) {
  auto arena = MakeArena(8 * kA);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 8; ++i) a.push_back(*arena->Allocate(kA, i + 1));
  EXPECT_EQ(arena->Stats().free_blocks, 0u);
  ASSERT_TRUE(arena->Free(a[2]).ok());
  ASSERT_TRUE(arena->Free(a[4]).ok());
  EXPECT_EQ(arena->Stats().free_blocks, 2u);
  ASSERT_TRUE(arena->Free(a[3]).ok());  // joins 2, 3 and 4
  ArenaStats st = arena->Stats();
  EXPECT_EQ(st.free_blocks, 1u);
  EXPECT_EQ(st.largest_free_block, 3 * kA);
  for (int i : {0, 1, 5, 6, 7}) ASSERT_TRUE(arena->Free(a[i]).ok());
  auto blocks = Blocks(*arena);
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, 8 * kA);
  EXPECT_TRUE(blocks[0].free);
}

TEST(ArenaTest, MoveSlidesABlockWithinTheRangeItWouldFree) {
  auto arena = MakeArena(8 * kA);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 8; ++i) a.push_back(*arena->Allocate(kA, i + 1));
  for (int i : {1, 2, 4, 5}) ASSERT_TRUE(arena->Free(a[i]).ok());
  // [0 | free free | 3 | free free | 6 7]: block 3 may go anywhere in [1, 6) units.
  ASSERT_TRUE(arena->Move(a[3], a[1]).ok());  // down, into the hole below
  auto blocks = Blocks(*arena);
  ASSERT_EQ(blocks.size(), 5u);
  EXPECT_EQ(blocks[1].address, a[1]);
  EXPECT_EQ(blocks[1].owner, 4u);  // the owner moves with the block
  EXPECT_FALSE(blocks[1].free);
  EXPECT_TRUE(blocks[2].free);  // the two holes became one above it
  EXPECT_EQ(blocks[2].size, 4 * kA);
  EXPECT_EQ(arena->Stats().largest_free_block, 4 * kA);
  EXPECT_EQ(arena->Stats().allocated_bytes, 4 * kA);
  ASSERT_TRUE(arena->Move(a[1], a[3]).ok());  // into the middle of the hole: a hole on each side
  blocks = Blocks(*arena);
  ASSERT_EQ(blocks.size(), 6u);
  EXPECT_TRUE(blocks[1].free && blocks[3].free);
  EXPECT_EQ(blocks[1].size, 2 * kA);
  EXPECT_EQ(blocks[3].size, 2 * kA);
  ASSERT_TRUE(arena->Free(a[3]).ok());  // the block is known at its new address
  EXPECT_EQ(arena->Stats().free_blocks, 1u);
}

TEST(ArenaTest, MoveRejectsWhatLeavesItsRange) {
  auto arena = MakeArena(8 * kA);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 4; ++i) a.push_back(*arena->Allocate(kA, i + 1));
  ASSERT_TRUE(arena->Free(a[1]).ok());
  EXPECT_EQ(arena->Move(a[2], a[0]).code(), absl::StatusCode::kInvalidArgument);  // over block 0
  EXPECT_EQ(arena->Move(a[2], a[3]).code(), absl::StatusCode::kInvalidArgument);  // over block 3
  EXPECT_EQ(arena->Move(a[2], a[1] + kA / 2).code(), absl::StatusCode::kInvalidArgument);  // misaligned
  EXPECT_EQ(arena->Move(a[1], a[1]).code(), absl::StatusCode::kInvalidArgument);  // a free block
  auto error = arena->Move(a[2], a[0]);
  EXPECT_THAT(std::string(error.message()), HasSubstr("can only move within"));
  EXPECT_TRUE(arena->Move(a[2], a[2]).ok());  // staying put is fine
  EXPECT_EQ(Blocks(*arena).size(), 5u);  // and nothing changed
}

TEST(ArenaTest, FreeRejectsWhatIsNotAnAllocatedBlockStart) {
  auto arena = MakeArena(8 * kA);
  auto a = *arena->Allocate(2 * kA, 1);
  EXPECT_EQ(arena->Free(a + kA).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Free(a + 2 * kA).code(), absl::StatusCode::kInvalidArgument);  // free block start
  EXPECT_EQ(arena->Free(0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(arena->Free(a).ok());
  EXPECT_EQ(arena->Free(a).code(), absl::StatusCode::kInvalidArgument);  // double free
  EXPECT_EQ(arena->Stats().frees, 1u);
}

TEST(ArenaTest, OwnersAreOpaqueAndSettable) {
  auto arena = MakeArena(8 * kA);
  auto a = *arena->Allocate(kA, 42);
  EXPECT_EQ(arena->Block(a)->owner, 42u);
  EXPECT_FALSE(arena->Block(a)->free);
  ASSERT_TRUE(arena->SetOwner(a, ~OwnerId{0}).ok());
  EXPECT_EQ(arena->Block(a)->owner, ~OwnerId{0});
  EXPECT_EQ(arena->SetOwner(a + kA, 1).code(), absl::StatusCode::kInvalidArgument);
  // The free block after `a` is visible through Block(); an address inside a block is not.
  auto free_block = arena->Block(a + kA);
  ASSERT_TRUE(free_block.ok());
  EXPECT_TRUE(free_block->free);
  EXPECT_EQ(free_block->size, 7 * kA);
  EXPECT_EQ(arena->Block(a + 2 * kA).status().code(), absl::StatusCode::kNotFound);
}

TEST(ArenaTest, AdjacentFreeBytes) {
  auto arena = MakeArena(16 * kA);
  std::vector<std::uintptr_t> a;
  for (std::size_t units : {1, 2, 3, 4}) a.push_back(*arena->Allocate(units * kA, 1));
  // Layout: [1 a0][2 a1][3 a2][4 a3][6 free]
  EXPECT_EQ(arena->AdjacentFreeBytes(a[3]), 6 * kA);
  EXPECT_EQ(arena->AdjacentFreeBytes(a[1]), 0u);
  ASSERT_TRUE(arena->Free(a[0]).ok());
  ASSERT_TRUE(arena->Free(a[2]).ok());
  EXPECT_EQ(arena->AdjacentFreeBytes(a[1]), 4 * kA);
  EXPECT_EQ(arena->AdjacentFreeBytes(a[3]), 9 * kA);
  EXPECT_EQ(arena->AdjacentFreeBytes(a[0]), 0u);  // not an allocated block
}

TEST(ArenaTest, StatsTrackPeakAndReset) {
  auto arena = MakeArena(16 * kA);
  auto a = *arena->Allocate(4 * kA, 1);
  auto b = *arena->Allocate(4 * kA, 1);
  ASSERT_TRUE(arena->Free(a).ok());
  ArenaStats st = arena->Stats();
  EXPECT_EQ(st.allocated_bytes, 4 * kA);
  EXPECT_EQ(st.peak_allocated_bytes, 8 * kA);
  EXPECT_EQ(arena->PeakAllocatedBytes(), 8 * kA);
  EXPECT_EQ(st.free_bytes, 12 * kA);
  EXPECT_EQ(st.free_blocks, 2u);
  EXPECT_EQ(st.largest_free_block, 8 * kA);
  arena->ResetPeak();
  EXPECT_EQ(arena->Stats().peak_allocated_bytes, 4 * kA);
  EXPECT_EQ(arena->PeakAllocatedBytes(), 4 * kA);
  ASSERT_TRUE(arena->Free(b).ok());
  EXPECT_EQ(arena->Stats().peak_allocated_bytes, 4 * kA);
}

TEST(ArenaTest, FailureWithoutHandlerNamesTheNumbers) {
  auto arena = MakeArena(8 * kA);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 8; ++i) a.push_back(*arena->Allocate(kA, 1));
  ASSERT_TRUE(arena->Free(a[1]).ok());
  ASSERT_TRUE(arena->Free(a[2]).ok());
  ASSERT_TRUE(arena->Free(a[5]).ok());
  auto r = arena->Allocate(3 * kA - 100, 1);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr(std::to_string(3 * kA - 100) + " bytes"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(3 * kA) + " aligned"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(3 * kA) + " bytes free"));
  EXPECT_THAT(msg, HasSubstr("largest free block " + std::to_string(2 * kA)));
  EXPECT_EQ(arena->Stats().pressure_allocations, 0u);
  EXPECT_EQ(arena->TryAllocate(3 * kA, 1).status().code(), absl::StatusCode::kResourceExhausted);
}

// Frees the allocated blocks it was given, one per call, lowest first.
class FreeingHandler : public PressureHandler {
 public:
  explicit FreeingHandler(std::vector<std::uintptr_t> victims) : victims_(std::move(victims)) {}
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) override {
    ++calls;
    last_bytes = bytes;
    // The arena's lock is not held: calling back in must not deadlock.
    (void)arena.Stats();
    if (next_ == victims_.size()) return false;
    EXPECT_TRUE(arena.Free(victims_[next_++]).ok());
    return true;
  }
  int calls = 0;
  std::size_t last_bytes = 0;

 private:
  std::vector<std::uintptr_t> victims_;
  std::size_t next_ = 0;
};

TEST(ArenaTest, PressureHandlerFreesUntilTheRequestFits) {
  auto arena = MakeArena(8 * kA);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 8; ++i) a.push_back(*arena->Allocate(kA, i + 1));
  FreeingHandler handler({a[3], a[4], a[5]});
  arena->SetPressureHandler(&handler);
  auto r = arena->Allocate(3 * kA - 1, 99);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, a[3]);
  EXPECT_EQ(handler.calls, 3);
  EXPECT_EQ(handler.last_bytes, 3 * kA);
  ArenaStats st = arena->Stats();
  EXPECT_EQ(st.pressure_allocations, 1u);
  EXPECT_EQ(st.allocated_bytes, 8 * kA);
  // TryAllocate never calls the handler.
  EXPECT_FALSE(arena->TryAllocate(kA, 1).ok());
  EXPECT_EQ(handler.calls, 3);
  EXPECT_EQ(arena->Stats().pressure_allocations, 1u);
}

TEST(ArenaTest, PressureHandlerThatFreesNothingFailsWithTheNumbers) {
  auto arena = MakeArena(8 * kA);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 8; ++i) a.push_back(*arena->Allocate(kA, i + 1));
  ASSERT_TRUE(arena->Free(a[6]).ok());
  FreeingHandler handler({a[0]});  // frees one block that does not help, then gives up
  arena->SetPressureHandler(&handler);
  auto r = arena->Allocate(2 * kA, 99);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(handler.calls, 2);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("cannot place " + std::to_string(2 * kA) + " bytes"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(2 * kA) + " bytes free"));
  EXPECT_THAT(msg, HasSubstr("largest free block " + std::to_string(kA)));
  EXPECT_THAT(msg, HasSubstr("freed nothing"));
  EXPECT_EQ(arena->Stats().pressure_allocations, 1u);
}

TEST(ArenaTest, RequestLargerThanTheArenaDoesNotCallTheHandler) {
  auto arena = MakeArena(8 * kA);
  auto a = *arena->Allocate(kA, 1);
  FreeingHandler handler({a});
  arena->SetPressureHandler(&handler);
  auto r = arena->Allocate(9 * kA, 2);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("larger than any segment"));
  EXPECT_EQ(handler.calls, 0);
  EXPECT_TRUE(arena->Block(a).ok());  // nothing was evicted for nothing
}

// Claims progress but frees nothing: the arena must not spin forever.
class LyingHandler : public PressureHandler {
 public:
  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t) override {
    ++calls;
    return true;
  }
  int calls = 0;
};

TEST(ArenaTest, HandlerClaimingProgressWithoutFreeingStops) {
  auto arena = MakeArena(2 * kA);
  ASSERT_TRUE(arena->Allocate(2 * kA, 1).ok());
  LyingHandler handler;
  arena->SetPressureHandler(&handler);
  EXPECT_EQ(arena->Allocate(kA, 2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(handler.calls, 1);
}

// Fails to make room for another reason than memory (a page-out whose write failed): the allocation fails with
// that error, its code kept, not as an out-of-memory one, and the arena is usable afterwards.
class FailingHandler : public PressureHandler {
 public:
  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t) override {
    ++calls;
    return absl::UnavailableError("writing the copy failed: No space left on device");
  }
  int calls = 0;
};

TEST(ArenaTest, AHandlersErrorFailsTheAllocationWithIt) {
  auto arena = MakeArena(2 * kA);
  auto a = arena->Allocate(2 * kA, 1);
  ASSERT_TRUE(a.ok());
  FailingHandler handler;
  arena->SetPressureHandler(&handler);
  auto r = arena->Allocate(kA, 2);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("making room for"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("No space left on device"));
  EXPECT_EQ(handler.calls, 1);
  ASSERT_TRUE(arena->Free(*a).ok());
  EXPECT_TRUE(arena->Allocate(kA, 2).ok());
}

// Frees nothing and says what holds the memory; reads the arena while saying it, as the engine's report does.
class DescribingHandler : public PressureHandler {
 public:
  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t) override { return false; }
  std::string DescribeMemory() override {
    std::size_t blocks = 0;
    arena->ForEachBlock([&](const BlockInfo&) { ++blocks; });
    return "all of it locked by a test (" + std::to_string(blocks) + " block(s))";
  }
  Arena* arena = nullptr;
};

TEST(ArenaTest, OutOfMemoryErrorCarriesWhatTheHandlerSaysHoldsTheMemory) {
  auto arena = MakeArena(2 * kA);
  ASSERT_TRUE(arena->Allocate(2 * kA, 1).ok());
  DescribingHandler handler;
  handler.arena = arena.get();
  arena->SetPressureHandler(&handler);
  absl::StatusOr<std::uintptr_t> r = arena->Allocate(kA, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("the pressure handler freed nothing after 1 round(s); all of it locked by a test (1 block(s))"));
}

TEST(ArenaTest, GrowReservesSegmentsUpToTheLimit) {
  ArenaOptions options;
  options.alignment = kA;
  options.grow = true;
  options.growth_limit = std::size_t{5} << 20;
  auto arena = *Arena::Create(MakeVirtualProvider(), options);
  EXPECT_EQ(arena->Stats().reserved_bytes, 0u);
  auto a = arena->Allocate(std::size_t{3} << 20, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(arena->Stats().reserved_bytes, std::size_t{3} << 20);
  auto b = arena->Allocate(std::size_t{1} << 20, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(arena->Stats().reserved_bytes, std::size_t{5} << 20);  // the 2 MiB minimum, clamped to the limit
  EXPECT_TRUE(arena->Allocate(std::size_t{1} << 20, 3).ok());
  auto full = arena->Allocate(std::size_t{1} << 20, 4);
  ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("growth limit of 5242880 bytes"));
  ASSERT_TRUE(arena->Free(*a).ok());
  ASSERT_TRUE(arena->Free(*b).ok());
  EXPECT_EQ(arena->Stats().free_blocks, 2u);
}

TEST(ArenaTest, WindowPicksTheCheapestRunAndStopsAtBarriers) {
  auto arena = MakeArena(10 * kA);
  const std::uintptr_t base = Base(*arena);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 10; ++i) a.push_back(*arena->Allocate(kA, i + 1));
  ASSERT_TRUE(arena->Free(a[4]).ok());
  // Costs by owner: owner 3 is a barrier (locked).
  const std::vector<double> cost = {0, 5, 1, 0, 1, 0, 2, 9, 1, 1, 1};
  auto fn = [&](const BlockInfo& b) -> std::optional<double> {
    if (b.owner == 3) return std::nullopt;
    return cost[b.owner];
  };
  auto w = arena->FindWindow(3 * kA, fn);
  ASSERT_TRUE(w.has_value());
  // a[i] has owner i + 1; a2 is the barrier, a4 is free. Left of the barrier only 2 units fit. Right of it:
  // [a3 a4 a5] = 1 + 0 + 2 = 3, [a4 a5 a6] = 11, [a5 a6 a7] = 12, [a6 a7 a8] = 11, [a7 a8 a9] = 3.
  // Cheapest is 3, and of the two the one that ends lowest wins.
  EXPECT_EQ(w->address, base + 3 * kA);
  EXPECT_EQ(w->size, 3 * kA);
  EXPECT_DOUBLE_EQ(w->cost, 3);
  EXPECT_THAT(w->owners, ElementsAre(4, 6));
  // Right of the barrier there are exactly 7 units; nothing holds 8.
  auto w7 = arena->FindWindow(7 * kA, fn);
  ASSERT_TRUE(w7.has_value());
  EXPECT_EQ(w7->address, base + 3 * kA);
  EXPECT_THAT(w7->owners, ElementsAre(4, 6, 7, 8, 9, 10));
  EXPECT_FALSE(arena->FindWindow(8 * kA, fn).has_value());
  // A free hole large enough costs nothing.
  ASSERT_TRUE(arena->Free(a[5]).ok());
  auto w2 = arena->FindWindow(2 * kA, fn);
  ASSERT_TRUE(w2.has_value());
  EXPECT_EQ(w2->address, base + 4 * kA);
  EXPECT_EQ(w2->cost, 0);
  EXPECT_TRUE(w2->owners.empty());
}

TEST(ArenaTest, CallbacksMayQueryTheArenaButNotChangeItsBlocks) {
  auto arena = MakeArena(4 * kA);
  std::vector<std::uintptr_t> a;
  for (std::size_t units : {1, 2, 1}) a.push_back(*arena->Allocate(units * kA, a.size() + 1));
  ASSERT_TRUE(arena->Free(a[1]).ok());  // [a0][2 free][a2]
  int calls = 0;
  auto w = arena->FindWindow(3 * kA, [&](const BlockInfo& b) -> std::optional<double> {
    ++calls;
    // A DTE-style cost needs the adjacent free bytes: answered without deadlocking on the held lock.
    const std::size_t adjacent = arena->AdjacentFreeBytes(b.address);
    EXPECT_EQ(arena->Block(b.address)->owner, b.owner);
    EXPECT_EQ(arena->Stats().allocated_bytes, 2 * kA);
    EXPECT_TRUE(arena->SetOwner(b.address, b.owner + 10).ok());
    EXPECT_EQ(arena->Free(b.address).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(arena->Allocate(kA, 1).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(arena->TryAllocate(kA, 1).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(arena->FindWindow(kA, [](const BlockInfo&) { return std::optional<double>(0.0); }).has_value());
    return static_cast<double>(adjacent);
  });
  EXPECT_EQ(calls, 2);
  ASSERT_TRUE(w.has_value());
  // Both a0 and a2 cost 2 units (the free block between them): [a0][free] and [free][a2] tie, the lower end wins.
  EXPECT_EQ(w->address, a[0]);
  EXPECT_EQ(w->cost, 2.0 * kA);
  EXPECT_THAT(w->owners, ElementsAre(11));  // retagged inside the callback, before the window was built
  std::size_t visited = 0;
  arena->ForEachBlock([&](const BlockInfo& b) {
    ++visited;
    EXPECT_TRUE(arena->Block(b.address).ok());
    if (!b.free) {
      EXPECT_EQ(arena->Free(b.address).code(), absl::StatusCode::kFailedPrecondition);
    }
  });
  EXPECT_EQ(visited, 3u);
  // Outside the callbacks everything works again.
  EXPECT_TRUE(arena->Free(a[0]).ok());
  EXPECT_TRUE(arena->Allocate(kA, 1).ok());
}

TEST(ArenaTest, WindowTiesGoToTheLowestEnd) {
  auto arena = MakeArena(6 * kA);
  const std::uintptr_t base = Base(*arena);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(arena->Allocate(kA, i + 1).ok());
  auto w = arena->FindWindow(2 * kA, [](const BlockInfo&) -> std::optional<double> { return 1.0; });
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->address, base);
  EXPECT_EQ(w->size, 2 * kA);
  EXPECT_THAT(w->owners, ElementsAre(1, 2));
}

TEST(ArenaTest, ConcurrentAllocateAndFree) {
  constexpr int kThreads = 4;
  constexpr int kOps = 20000;
  auto arena = MakeArena(std::size_t{1} << 20, 64);  // 8x the most the threads can hold at once
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::uintptr_t> mine;
      std::uint64_t x = 88172645463325252ull + t;
      for (int i = 0; i < kOps; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (mine.size() < 64 && (x & 1)) {
          auto a = arena->Allocate(64 * (1 + (x >> 8) % 8), static_cast<OwnerId>(t + 1),
                                   (x & 2) ? Placement::kLow : Placement::kHigh);
          if (!a.ok()) {
            ++failures;
            continue;
          }
          auto b = arena->Block(*a);
          if (!b.ok() || b->owner != static_cast<OwnerId>(t + 1)) ++failures;
          mine.push_back(*a);
        } else if (!mine.empty()) {
          const std::size_t k = (x >> 20) % mine.size();
          if (!arena->Free(mine[k]).ok()) ++failures;
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto a : mine) {
        if (!arena->Free(a).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ArenaStats st = arena->Stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.free_blocks, 1u);
  EXPECT_EQ(st.allocations, st.frees);
}

// One thread allocates into a full arena, so every allocation needs the handler, which evicts from a shared
// pool; two other threads free blocks from the same pool and search windows at the same time. Exercises the
// handler running without the arena's lock, concurrently with Free and FindWindow. The allocating thread can
// never fail: when the pool is empty at most two blocks (being freed by the others) are allocated.
class PoolHandler : public PressureHandler {
 public:
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t) override {
    const std::optional<std::uintptr_t> victim = Take();
    if (!victim.has_value()) return false;
    ++evictions;
    return arena.Free(*victim).ok();
  }
  std::optional<std::uintptr_t> Take() {
    std::lock_guard<std::mutex> lock(mu);
    if (pool.empty()) return std::nullopt;
    const std::uintptr_t a = pool.front();
    pool.pop_front();
    return a;
  }
  void Add(std::uintptr_t a) {
    std::lock_guard<std::mutex> lock(mu);
    pool.push_back(a);
  }
  std::mutex mu;
  std::deque<std::uintptr_t> pool;
  std::atomic<int> evictions{0};
};

TEST(ArenaTest, ConcurrentFreesAndSearchesUnderPressure) {
  constexpr int kOps = 20000;
  auto arena = MakeArena(64 * kA);
  PoolHandler handler;
  arena->SetPressureHandler(&handler);
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, frees{0};
  std::thread allocator([&] {
    for (int i = 0; i < kOps; ++i) {
      auto a = arena->Allocate(kA * (1 + i % 4), static_cast<OwnerId>(i + 1), (i & 1) ? Placement::kLow
                                                                                      : Placement::kHigh);
      if (!a.ok()) {
        ++failures;
        continue;
      }
      handler.Add(*a);
    }
    done = true;
  });
  std::vector<std::thread> others;
  for (int t = 0; t < 2; ++t) {
    others.emplace_back([&, t] {
      for (int i = 0; !done; ++i) {
        if (i % 3 == t) {
          if (auto victim = handler.Take()) {
            if (!arena->Free(*victim).ok()) ++failures;
            ++frees;
          }
        } else {
          auto w = arena->FindWindow(8 * kA, [](const BlockInfo& b) -> std::optional<double> {
            if (b.owner % 7 == 0) return std::nullopt;
            return static_cast<double>(b.owner % 5);
          });
          if (w.has_value() && w->size < 8 * kA) ++failures;
        }
      }
    });
  }
  allocator.join();
  for (auto& th : others) th.join();
  EXPECT_EQ(failures.load(), 0);
  ArenaStats st = arena->Stats();
  EXPECT_GT(st.pressure_allocations, 0u);
  EXPECT_EQ(st.allocations, static_cast<std::uint64_t>(kOps));
  EXPECT_EQ(st.frees, static_cast<std::uint64_t>(handler.evictions.load() + frees.load()));
  EXPECT_EQ(st.allocated_bytes + st.free_bytes, 64 * kA);
  std::size_t pooled = 0;
  for (auto a : handler.pool) pooled += arena->Block(a)->size;
  EXPECT_EQ(pooled, st.allocated_bytes);
}

TEST(ArenaTest, SearchTimeIsCounted) {
  auto arena = MakeArena(std::size_t{1} << 30);
  for (int i = 0; i < 5000; ++i) ASSERT_TRUE(arena->Allocate(kA, i + 1).ok());
  const std::uint64_t before = arena->Stats().search_ns;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(arena->FindWindow(std::size_t{1} << 30, [](const BlockInfo& b) {
                       return std::optional<double>(static_cast<double>(b.owner % 3));
                     }).has_value());
  }
  // 20 passes over 5001 blocks take well over a microsecond.
  EXPECT_GT(arena->Stats().search_ns, before + 1000);
}

TEST(ArenaTest, GrowingHostArenaUsesSeveralSegments) {
  ArenaOptions options;
  options.alignment = 64;
  options.capacity = std::size_t{1} << 20;
  options.grow = true;
  auto arena = *Arena::Create(MakeHostProvider(), options);
  std::vector<std::uintptr_t> a;
  for (int i = 0; i < 6; ++i) {
    auto p = arena->Allocate(std::size_t{3} << 19, i + 1);  // 1.5 MiB: each needs a new 2 MiB segment
    ASSERT_TRUE(p.ok()) << p.status();
    std::memset(reinterpret_cast<void*>(*p), i, std::size_t{3} << 19);
    a.push_back(*p);
  }
  ArenaStats st = arena->Stats();
  EXPECT_EQ(st.allocated_bytes, 6 * (std::size_t{3} << 19));
  EXPECT_EQ(st.reserved_bytes, (std::size_t{1} << 20) + 6 * (std::size_t{2} << 20));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(reinterpret_cast<unsigned char*>(a[i])[12345], static_cast<unsigned char>(i));
    ASSERT_TRUE(arena->Free(a[i]).ok());
  }
  EXPECT_EQ(arena->Stats().free_blocks, 7u);  // one per segment
}

TEST(ArenaTest, HostArenaMemoryIsUsable) {
  ArenaOptions options;
  options.capacity = std::size_t{4} << 20;
  options.alignment = 64;
  auto arena = *Arena::Create(MakeHostProvider(), options);
  EXPECT_TRUE(arena->provider().BacksMemory());
  EXPECT_EQ(arena->provider().Name(), "host");
  auto a = *arena->Allocate(1000, 1);
  auto b = *arena->Allocate(std::size_t{1} << 20, 2, Placement::kHigh);
  EXPECT_EQ(a % 64, 0u);
  EXPECT_EQ(b % 64, 0u);
  std::memset(reinterpret_cast<void*>(a), 0xab, 1000);
  std::memset(reinterpret_cast<void*>(b), 0xcd, std::size_t{1} << 20);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(a)[999], 0xab);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(b)[0], 0xcd);
}

}  // namespace
}  // namespace remat
