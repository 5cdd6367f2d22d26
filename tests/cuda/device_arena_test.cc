// DeviceArena over the test double: budget and stats, lazy reservation and empty_cache, stream-ordered reuse
// (pending frees, record_stream, the single-to-multi-stream barrier), pressure and out-of-memory.
#include "allocator/cuda/device_arena.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::cuda {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<DeviceArena> MakeArena(FakeCudaRuntime& rt, std::size_t budget) {
  DeviceArenaOptions options;
  options.budget = budget;
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena = DeviceArena::Create(&rt, options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return std::move(*arena);
}

TEST(CudaDeviceArena, ReservesTheBudgetLazilyAndCountsStats) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 1 << 20);
  EXPECT_EQ(rt.live_device_allocations(), 0u);
  EXPECT_EQ(arena->LargestFreeBlock(), 1u << 20);  // what cacheInfo reports before the first allocation
  std::uintptr_t a = *arena->Allocate(1000, nullptr);
  std::uintptr_t b = *arena->Allocate(3000, nullptr);
  EXPECT_EQ(a % 512, 0u);
  EXPECT_EQ(rt.live_device_allocations(), 1u);
  DeviceArenaStats st = arena->Stats();
  EXPECT_EQ(st.budget, 1u << 20);
  EXPECT_EQ(st.allocated_bytes.current, 1024 + 3072);
  EXPECT_EQ(st.requested_bytes.current, 4000);
  EXPECT_EQ(st.reserved_bytes.current, 1 << 20);
  EXPECT_EQ(st.allocation.current, 2);
  EXPECT_EQ(st.segment.current, 1);
  ASSERT_TRUE(arena->Free(b).ok());
  st = arena->Stats();
  EXPECT_EQ(st.allocated_bytes.current, 1024);
  EXPECT_EQ(st.allocated_bytes.peak, 4096);
  arena->ResetPeak();
  EXPECT_EQ(arena->Stats().allocated_bytes.peak, 1024);
  EXPECT_EQ(*arena->BlockSize(a), 1024u);
  EXPECT_EQ(arena->SegmentOf(a + 100)->size, 1u << 20);
  EXPECT_FALSE(arena->SegmentOf(12345).ok());

  // empty_cache keeps the segment while a block lives, releases it when none does.
  ASSERT_TRUE(arena->EmptyCache().ok());
  EXPECT_EQ(rt.live_device_allocations(), 1u);
  ASSERT_TRUE(arena->Free(a).ok());
  ASSERT_TRUE(arena->EmptyCache().ok());
  EXPECT_EQ(rt.live_device_allocations(), 0u);
  EXPECT_EQ(arena->Stats().reserved_bytes.current, 0);
  EXPECT_EQ(arena->arena(), nullptr);
  EXPECT_TRUE(arena->Allocate(512, nullptr).ok());  // reserves again
  EXPECT_EQ(arena->Stats().device_mallocs, 2);
}

TEST(CudaDeviceArena, BudgetAsAFractionOfDeviceMemory) {
  FakeCudaRuntime rt(FakeCudaOptions{1, 1 << 20});
  DeviceArenaOptions options;
  options.budget_fraction = 0.25;
  auto arena = std::move(*DeviceArena::Create(&rt, options));
  EXPECT_EQ(*arena->Budget(), 1u << 18);
  options.budget_fraction = 1.5;
  EXPECT_FALSE(DeviceArena::Create(&rt, options).ok());
}

TEST(CudaDeviceArena, BudgetChangesOnlyWhenEmpty) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 1 << 20);
  std::uintptr_t a = *arena->Allocate(512, nullptr);
  absl::Status status = arena->SetBudget(2 << 20);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("only change while nothing is allocated"));
  ASSERT_TRUE(arena->Free(a).ok());
  ASSERT_TRUE(arena->SetBudget(2 << 20).ok());
  EXPECT_EQ(*arena->Budget(), 2u << 20);
}

TEST(CudaDeviceArena, SingleStreamReusesAtOnce) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  cudaStream_t s = *rt.StreamCreate();
  rt.HoldStream(s);  // the GPU is behind: the freed block's last use has not run
  std::uintptr_t a = *arena->Allocate(4096, s);
  ASSERT_TRUE(arena->Free(a).ok());
  // Same stream: stream order makes immediate reuse safe, and nothing waits.
  EXPECT_EQ(*arena->Allocate(4096, s), a);
  EXPECT_FALSE(arena->Stats().multi_stream);
  EXPECT_EQ(rt.counters().synchronizations, 0u);
}

TEST(CudaDeviceArena, BlockWithPendingUseOnAnotherStreamIsNotReusedUntilItsEventCompletes) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  cudaStream_t s1 = *rt.StreamCreate();
  cudaStream_t s2 = *rt.StreamCreate();
  std::uintptr_t x = *arena->Allocate(2048, s1);
  ASSERT_TRUE(arena->RecordStream(x, s2).ok());  // torch's record_stream: s2 uses x too
  EXPECT_TRUE(arena->Stats().multi_stream);
  rt.HoldStream(s2);
  bool use_done = false;
  rt.Launch(s2, [&] { use_done = true; });  // the recorded use, still queued
  ASSERT_TRUE(arena->Free(x).ok());
  DeviceArenaStats st = arena->Stats();
  EXPECT_EQ(st.pending_blocks, 1u);
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_EQ(st.active_bytes.current, 2048);

  // Plenty of room elsewhere: the other half is handed out, not x.
  std::uintptr_t y = *arena->Allocate(2048, s1);
  EXPECT_NE(y, x);
  EXPECT_FALSE(use_done);
  EXPECT_EQ(arena->Stats().pending_blocks, 1u);

  // The use finishes on the GPU: the next allocation finds the event complete and reuses x without waiting.
  rt.ReleaseStream(s2);
  EXPECT_TRUE(use_done);
  const auto syncs = rt.counters().synchronizations;
  EXPECT_EQ(*arena->Allocate(2048, s1), x);
  EXPECT_EQ(rt.counters().synchronizations, syncs);
  EXPECT_EQ(arena->Stats().pending_blocks, 0u);
}

// Under pressure a pending block is reused in the allocating stream's order (as cudaMallocAsync pools do): the
// stream waits for the block's other uses on the device, the host does not wait, and work the stream queues on the
// reused block runs only after those uses.
TEST(CudaDeviceArena, UnderPressureReusesInTheAllocatingStreamsOrderWithoutTheHostWaiting) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 2048);
  cudaStream_t s1 = *rt.StreamCreate();
  cudaStream_t s2 = *rt.StreamCreate();
  std::uintptr_t x = *arena->Allocate(2048, s1);
  ASSERT_TRUE(arena->RecordStream(x, s2).ok());
  rt.HoldStream(s2);
  bool use_done = false;
  rt.Launch(s2, [&] { use_done = true; });
  ASSERT_TRUE(arena->Free(x).ok());
  const std::uint64_t syncs = rt.counters().synchronizations;
  absl::StatusOr<std::uintptr_t> again = arena->Allocate(2048, s1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, x);
  EXPECT_FALSE(use_done);  // still queued on s2: nobody waited on the host
  EXPECT_EQ(rt.counters().synchronizations, syncs);
  EXPECT_EQ(rt.host_waits_for(s1) + rt.host_waits_for(s2), 0u);
  bool reuse_saw_use_done = false;
  rt.Launch(s1, [&] { reuse_saw_use_done = use_done; });  // the new owner's kernel
  EXPECT_EQ(rt.PendingWork(s1), 3u);  // the wait for s2's event, the handoff event, the kernel
  rt.ReleaseStream(s2);
  EXPECT_TRUE(reuse_saw_use_done);
  EXPECT_EQ(arena->Stats().synchronizations, 0);
  EXPECT_EQ(arena->Stats().stream_ordered_reclaims, 1);
  EXPECT_EQ(arena->Stats().pressure_allocations, 1);
  ASSERT_TRUE(arena->Free(*again).ok());
}

// Blocks one stream took back in its own order are handed to another stream only after that stream waits for them.
TEST(CudaDeviceArena, AnotherStreamWaitsForBlocksTakenBackInAStreamsOrder) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  cudaStream_t s1 = *rt.StreamCreate();
  cudaStream_t s2 = *rt.StreamCreate();
  cudaStream_t s3 = *rt.StreamCreate();
  std::uintptr_t x = *arena->Allocate(4096, s1);
  ASSERT_TRUE(arena->RecordStream(x, s2).ok());
  rt.HoldStream(s2);
  bool use_done = false;
  rt.Launch(s2, [&] { use_done = true; });
  ASSERT_TRUE(arena->Free(x).ok());
  std::uintptr_t small = *arena->Allocate(1024, s1);  // under pressure: takes x back in s1's order
  EXPECT_EQ(arena->Stats().stream_ordered_reclaims, 1);
  std::uintptr_t other = *arena->Allocate(1024, s3);  // part of x: s3 must be ordered after s2's use too
  EXPECT_NE(other, small);
  bool s3_saw_use_done = false;
  rt.Launch(s3, [&] { s3_saw_use_done = use_done; });
  rt.ReleaseStream(s2);
  EXPECT_TRUE(s3_saw_use_done);
  EXPECT_EQ(rt.counters().synchronizations, 0u);
  ASSERT_TRUE(arena->Free(small).ok());
  ASSERT_TRUE(arena->Free(other).ok());
}

TEST(CudaDeviceArena, ANewStreamWaitsForWorkOfTheFirstStream) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 2048);
  cudaStream_t s1 = *rt.StreamCreate();
  cudaStream_t s2 = *rt.StreamCreate();
  rt.HoldStream(s1);
  std::vector<int> order;
  std::uintptr_t x = *arena->Allocate(2048, s1);
  rt.Launch(s1, [&] { order.push_back(1); });  // last use of x on s1, queued
  ASSERT_TRUE(arena->Free(x).ok());            // single-stream mode: back in the arena at once
  // s2 appears and gets the same memory: it must not run before s1's queued use.
  EXPECT_EQ(*arena->Allocate(2048, s2), x);
  rt.Launch(s2, [&] { order.push_back(2); });
  EXPECT_TRUE(order.empty());
  rt.ReleaseStream(s1);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(CudaDeviceArena, WithoutAHandlerFailsNamingTheRequest) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  std::uintptr_t a = *arena->Allocate(3000, nullptr);
  absl::StatusOr<std::uintptr_t> big = arena->Allocate(2000, nullptr);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("tried to allocate 2000 bytes (2048 aligned)"));
  EXPECT_THAT(big.status().message(), HasSubstr("budget 4096 bytes, allocated 3072"));
  EXPECT_EQ(arena->Stats().ooms, 1);
  ASSERT_TRUE(arena->Free(a).ok());
}

class FreeingHandler final : public PressureHandler {
 public:
  FreeingHandler(DeviceArena* arena, std::vector<std::uintptr_t> victims) : arena_(arena), victims_(victims) {}
  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t bytes) override {
    ++calls;
    last_request = bytes;
    if (victims_.empty()) return false;
    EXPECT_TRUE(arena_->Free(victims_.back()).ok());
    victims_.pop_back();
    return true;
  }
  int calls = 0;
  std::size_t last_request = 0;

 private:
  DeviceArena* arena_;
  std::vector<std::uintptr_t> victims_;
};

TEST(CudaDeviceArena, CallsThePressureHandlerWhenTheBudgetIsFull) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  std::uintptr_t a = *arena->Allocate(2048, nullptr);
  std::uintptr_t b = *arena->Allocate(2048, nullptr);
  FreeingHandler handler(arena.get(), {a});
  arena->SetPressureHandler(&handler);
  absl::StatusOr<std::uintptr_t> c = arena->Allocate(2048, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, a);
  EXPECT_EQ(handler.calls, 1);
  EXPECT_EQ(handler.last_request, 2048u);
  // Nothing more to evict: the handler gives up and the allocation fails.
  EXPECT_EQ(arena->Allocate(2048, nullptr).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(handler.calls, 2);
  arena->SetPressureHandler(nullptr);
  ASSERT_TRUE(arena->Free(b).ok());
  ASSERT_TRUE(arena->Free(*c).ok());
}

TEST(CudaDeviceArena, TryAllocateTakesOnlyWhatFitsNowAndNeverAsksTheHandler) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  std::uintptr_t a = *arena->Allocate(2048, nullptr);
  FreeingHandler handler(arena.get(), {a});
  arena->SetPressureHandler(&handler);
  absl::StatusOr<std::uintptr_t> top = arena->TryAllocate(1024, nullptr, Placement::kTop);
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(*top, a + 3072);  // the highest 1 KiB of the free half
  EXPECT_TRUE(arena->Owns(*top));
  EXPECT_EQ(arena->Stats().allocated_bytes.current, 3072);
  EXPECT_EQ(arena->TryAllocate(2048, nullptr).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(handler.calls, 0);
  arena->SetPressureHandler(nullptr);
  ASSERT_TRUE(arena->Free(a).ok());
  ASSERT_TRUE(arena->Free(*top).ok());
}

TEST(CudaDeviceArena, MoveSlidesABlockWithItsBytesAcrossAnOverlap) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8192);
  std::uintptr_t hole = *arena->Allocate(1024, nullptr);
  std::uintptr_t block = *arena->Allocate(3000, nullptr);  // 3072 aligned: the slide overlaps itself
  auto* bytes = reinterpret_cast<unsigned char*>(block);
  for (int i = 0; i < 3000; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  ASSERT_TRUE(arena->Free(hole).ok());
  const std::uint64_t copies = rt.counters().copies;
  ASSERT_TRUE(arena->Move(block, hole).ok());
  EXPECT_GE(rt.counters().copies, copies + 3);  // chunks no longer than the 1 KiB distance
  EXPECT_TRUE(arena->Owns(hole));
  EXPECT_FALSE(arena->Owns(block));
  EXPECT_EQ(*arena->BlockSize(hole), 3072u);
  auto* moved = reinterpret_cast<unsigned char*>(hole);
  int same = 0;
  for (int i = 0; i < 3000; ++i) same += moved[i] == static_cast<unsigned char>(i * 7 + 3);
  EXPECT_EQ(same, 3000);
  EXPECT_EQ(arena->Move(block, hole).code(), absl::StatusCode::kInvalidArgument);  // no longer a live block
  ASSERT_TRUE(arena->Free(hole).ok());
}

// A short slide of a large block: 64 KiB by 512 bytes would be 128 device-to-device copies; the bytes bounce
// through pinned host memory instead (one chunk: two copies), and the pinned buffer is freed once they have run (an
// event, checked at the next allocation), without the host waiting.
TEST(CudaDeviceArena, AShortSlideOfALargeBlockBouncesThroughPinnedHostMemory) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 1 << 20);
  std::uintptr_t hole = *arena->Allocate(512, nullptr);
  std::uintptr_t block = *arena->Allocate(64 * 1024, nullptr);
  ASSERT_EQ(block, hole + 512);
  auto* bytes = reinterpret_cast<unsigned char*>(block);
  for (int i = 0; i < 64 * 1024; ++i) bytes[i] = static_cast<unsigned char>(i * 13 + 1);
  ASSERT_TRUE(arena->Free(hole).ok());
  const FakeCudaCounters before = rt.counters();
  ASSERT_TRUE(arena->Move(block, hole).ok());
  EXPECT_EQ(rt.counters().copies, before.copies + 2);
  EXPECT_EQ(arena->Stats().move_bounces, 1);
  EXPECT_EQ(rt.counters().synchronizations, before.synchronizations);
  ASSERT_TRUE(arena->Free(*arena->Allocate(512, nullptr)).ok());  // the copies have run: the buffer goes
  EXPECT_EQ(rt.live_host_allocations(), 0u);
  auto* moved = reinterpret_cast<unsigned char*>(hole);
  int same = 0;
  for (int i = 0; i < 64 * 1024; ++i) same += moved[i] == static_cast<unsigned char>(i * 13 + 1);
  EXPECT_EQ(same, 64 * 1024);
  ASSERT_TRUE(arena->Free(hole).ok());
}

// A copy that fails mid-slide: the block has moved in the arena (its old range may be taken already), so Move says
// where it is now and that its bytes are lost, rather than leaving the caller pointing at freed memory.
TEST(CudaDeviceArena, AFailedCopyDuringAMoveIsDataLossAndTheBlockIsAtItsNewAddress) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8192);
  std::uintptr_t hole = *arena->Allocate(1024, nullptr);
  std::uintptr_t block = *arena->Allocate(3000, nullptr);
  ASSERT_TRUE(arena->Free(hole).ok());
  rt.FailNextCopy();
  const absl::Status moved = arena->Move(block, hole);
  EXPECT_EQ(moved.code(), absl::StatusCode::kDataLoss) << moved;
  EXPECT_THAT(moved.message(), HasSubstr("contents are lost"));
  EXPECT_THAT(moved.message(), HasSubstr("injected cudaErrorLaunchFailure"));
  EXPECT_TRUE(arena->Owns(hole));
  EXPECT_FALSE(arena->Owns(block));
  ASSERT_TRUE(arena->Free(hole).ok());
  EXPECT_EQ(arena->Stats().allocated_bytes.current, 0);
}

TEST(CudaDeviceArena, ABlockAnotherStreamUsesDoesNotMove) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8192);
  std::uintptr_t hole = *arena->Allocate(1024, nullptr);
  std::uintptr_t block = *arena->Allocate(1024, nullptr);
  cudaStream_t other = *rt.StreamCreate();
  ASSERT_TRUE(arena->RecordStream(block, other).ok());
  ASSERT_TRUE(arena->Free(hole).ok());
  EXPECT_EQ(arena->Move(block, hole).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(arena->Free(block).ok());
}

// The runtime attached as pressure handler keeps the arena's address (the engine's): a budget change, which would
// release the segment, is refused until it detaches.
TEST(CudaDeviceArena, BudgetDoesNotChangeWhileAPressureHandlerIsAttached) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 1 << 20);
  absl::StatusOr<Arena*> reserved = arena->Reserve();
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  FreeingHandler handler(arena.get(), {});
  arena->SetPressureHandler(&handler);
  for (const absl::Status& status : {arena->SetBudget(2 << 20), arena->SetBudgetFraction(0.5)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("cannot change while the remat engine runs on it"));
  }
  EXPECT_EQ(arena->arena(), *reserved);
  EXPECT_EQ(*arena->Budget(), 1u << 20);
  arena->SetPressureHandler(nullptr);
  ASSERT_TRUE(arena->SetBudget(2 << 20).ok());
  EXPECT_EQ(*arena->Budget(), 2u << 20);
}

TEST(CudaDeviceArena, EmptyCacheKeepsTheSegmentWhileAPressureHandlerIsAttached) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  absl::StatusOr<Arena*> reserved = arena->Reserve();
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(arena->arena(), *reserved);
  FreeingHandler handler(arena.get(), {});
  arena->SetPressureHandler(&handler);
  ASSERT_TRUE(arena->EmptyCache().ok());
  EXPECT_EQ(arena->arena(), *reserved);  // the runtime holds on to it
  arena->SetPressureHandler(nullptr);
  ASSERT_TRUE(arena->EmptyCache().ok());
  EXPECT_EQ(arena->arena(), nullptr);
}

TEST(CudaDeviceArena, EvictionsOnBusyStreamsAreWaitedForOnTheDevice) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  cudaStream_t s1 = *rt.StreamCreate();
  cudaStream_t s2 = *rt.StreamCreate();
  std::uintptr_t a = *arena->Allocate(2048, s1);
  std::uintptr_t b = *arena->Allocate(2048, s2);  // multi-stream from here on
  rt.HoldStream(s1);
  bool use_done = false;
  rt.Launch(s1, [&] { use_done = true; });
  FreeingHandler handler(arena.get(), {a});  // the runtime evicts a, whose last use is still queued on s1
  arena->SetPressureHandler(&handler);
  absl::StatusOr<std::uintptr_t> c = arena->Allocate(2048, s2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, a);
  // s2 reuses a after a's last use on s1, on the device: its next kernel runs only once s1 has run.
  bool reuse_saw_use_done = false;
  rt.Launch(s2, [&] { reuse_saw_use_done = use_done; });
  EXPECT_FALSE(use_done);
  rt.ReleaseStream(s1);
  EXPECT_TRUE(reuse_saw_use_done);
  EXPECT_EQ(rt.counters().synchronizations, 0u);
  arena->SetPressureHandler(nullptr);
  ASSERT_TRUE(arena->Free(b).ok());
  ASSERT_TRUE(arena->Free(*c).ok());
}

TEST(CudaDeviceArena, RejectsUnknownAddresses) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 4096);
  EXPECT_EQ(arena->Free(0x1000).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->RecordStream(0x1000, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(arena->Owns(0x1000));
}

TEST(CudaDeviceArena, ReservationFailureIsReported) {
  FakeCudaRuntime rt(FakeCudaOptions{1, 1 << 20});
  auto arena = MakeArena(rt, 2 << 20);  // more than the device has
  absl::StatusOr<std::uintptr_t> a = arena->Allocate(512, nullptr);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(a.status().message(), HasSubstr("cannot reserve the CUDA budget of 2097152 bytes on device 0"));
}

TEST(CudaDeviceArena, ThreadsOnTheirOwnStreamsShareTheBudget) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 64 << 10);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t stream = *rt.StreamCreate();
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::uintptr_t> held;
      for (int i = 0; i < 500; ++i) {
        if (held.size() < 4 && rng() % 3 != 0) {
          absl::StatusOr<std::uintptr_t> a = arena->Allocate(512 + rng() % 4096, stream);
          if (a.ok()) {
            held.push_back(*a);
          } else if (a.status().code() != absl::StatusCode::kResourceExhausted) {
            ++failures;
          }
        } else if (!held.empty()) {
          if (!arena->Free(held.back()).ok()) ++failures;
          held.pop_back();
        }
      }
      for (std::uintptr_t a : held) {
        if (!arena->Free(a).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(arena->EmptyCache().ok());
  const DeviceArenaStats st = arena->Stats();
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_EQ(st.active_bytes.current, 0);
  EXPECT_EQ(st.pending_blocks, 0u);
  EXPECT_EQ(st.reserved_bytes.current, 0);
  EXPECT_TRUE(st.multi_stream);
}

}  // namespace
}  // namespace remat::cuda
