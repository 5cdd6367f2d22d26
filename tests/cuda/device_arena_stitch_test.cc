// DeviceArena with DeviceArenaKind::kStitch over the test double (issue 18, item 4): a request needs free granules,
// not a hole; the budget and the out-of-memory report count physical bytes; eviction gives the victim's granules to
// the request (unmapped after the device finished with them); empty_cache gives everything back; a device without
// virtual memory management falls back to the contiguous arena; live blocks never share physical memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "allocator/cuda/device_arena.h"
#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::cuda {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGranule = 2 * kMiB;

std::unique_ptr<DeviceArena> MakeArena(FakeCudaRuntime& rt, std::size_t budget, DeviceArenaKind kind,
                                       std::size_t granule = 0) {
  DeviceArenaOptions options;
  options.budget = budget;
  options.kind = kind;
  options.granule = granule;
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena = DeviceArena::Create(&rt, options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return std::move(*arena);
}

// Four 2 MiB blocks fill an 8 MiB budget; the first and third go: 4 MiB free, in two holes.
std::vector<std::uintptr_t> FillAndFreeEveryOther(DeviceArena& arena) {
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*arena.Allocate(kGranule, nullptr));
  EXPECT_TRUE(arena.Free(blocks[0]).ok());
  EXPECT_TRUE(arena.Free(blocks[2]).ok());
  return {blocks[1], blocks[3]};
}

TEST(CudaStitchArena, ServesARequestThatAFragmentedContiguousArenaCannot) {
  FakeCudaRuntime rt;
  auto contiguous = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kContiguous);
  FillAndFreeEveryOther(*contiguous);
  const absl::StatusOr<std::uintptr_t> refused = contiguous->Allocate(4 * kMiB, nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("largest free block 2097152"));

  FakeCudaRuntime vmm;
  auto stitched = MakeArena(vmm, 8 * kMiB, DeviceArenaKind::kStitch);
  FillAndFreeEveryOther(*stitched);
  EXPECT_EQ(stitched->LargestFreeBlock(), 4 * kMiB);  // two free granules, wherever they are
  const absl::StatusOr<std::uintptr_t> big = stitched->Allocate(4 * kMiB, nullptr);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(vmm.Accessible(*big, 4 * kMiB, 0));
  std::memset(reinterpret_cast<void*>(*big), 0x3C, 4 * kMiB);  // device memory of the double: writable
  const DeviceArenaStats stats = stitched->Stats();
  EXPECT_TRUE(stats.stitched);
  EXPECT_EQ(stats.granule, kGranule);
  EXPECT_EQ(stats.physical_bytes, 8 * kMiB);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<std::int64_t>(8 * kMiB));  // torch's memory_reserved: the budget
  EXPECT_EQ(vmm.device_bytes_in_use(0), 8 * kMiB);  // never more physical memory than the budget
  EXPECT_EQ(stats.stitch.steals, 2u);  // the two freed granules moved to the new range
  EXPECT_EQ(vmm.live_device_allocations(), 0u);  // no cudaMalloc
}

TEST(CudaStitchArena, OutOfMemoryIsReportedInPhysicalBytes) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kStitch);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(arena->Allocate(kGranule, nullptr).ok());
  EXPECT_EQ(arena->LargestFreeBlock(), 0u);  // cacheInfo: address space is free, memory is not
  const absl::StatusOr<std::uintptr_t> more = arena->Allocate(1024, nullptr);
  ASSERT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_THAT(more.status().message(), HasSubstr("tried to allocate 1024 bytes"));
  EXPECT_THAT(more.status().message(), HasSubstr("budget 8388608 bytes of physical memory in 2097152-byte granules, "
                                                 "mapped 8388608 (0 granule(s) free)"));
  EXPECT_EQ(arena->Stats().ooms, 1);
}

// The runtime's eviction, as the engine does it: the pressure handler frees blocks through the device arena.
class EvictBlocks final : public PressureHandler {
 public:
  EvictBlocks(DeviceArena* arena, std::vector<std::uintptr_t> victims) : arena_(arena), victims_(std::move(victims)) {}
  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t) override {
    if (victims_.empty()) return false;
    const absl::Status freed = arena_->Free(victims_.back());
    victims_.pop_back();
    if (!freed.ok()) return freed;
    return true;
  }
  std::string DescribeMemory() override { return ""; }

 private:
  DeviceArena* arena_;
  std::vector<std::uintptr_t> victims_;
};

TEST(CudaStitchArena, EvictedBlocksGiveTheirGranulesToTheRequestOnceTheDeviceIsDoneWithThem) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kStitch);
  absl::StatusOr<cudaStream_t> stream = rt.StreamCreate();
  ASSERT_TRUE(stream.ok());
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*arena->Allocate(kGranule, *stream));
  // The GPU is behind: a kernel still queued reads the first victim.
  rt.HoldStream(*stream);
  bool ran = false;
  rt.Launch(*stream, blocks[0], kGranule, [&] { ran = true; });
  EvictBlocks evict(arena.get(), {blocks[2], blocks[0]});  // two non-adjacent victims
  arena->SetPressureHandler(&evict);
  const std::size_t before = rt.vmm_log().size();
  const absl::StatusOr<std::uintptr_t> big = arena->Allocate(4 * kMiB, *stream);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(ran);  // the host waited for the device before taking the victim's memory
  EXPECT_EQ(rt.counters().faults, 0u);
  std::vector<std::uintptr_t> unmapped, mapped;
  const std::vector<VmmCall> log = rt.vmm_log();
  for (std::size_t i = before; i < log.size(); ++i) {
    const VmmCall& call = log[i];
    if (call.kind == VmmCall::Kind::kUnmap) unmapped.push_back(call.address);
    if (call.kind == VmmCall::Kind::kMap) mapped.push_back(call.address);
  }
  EXPECT_THAT(unmapped, ::testing::UnorderedElementsAre(blocks[0], blocks[2]));
  EXPECT_THAT(mapped, ::testing::ElementsAre(*big, *big + kGranule));
  EXPECT_TRUE(rt.Accessible(*big, 4 * kMiB, 0));
  EXPECT_FALSE(rt.Accessible(blocks[0], kGranule, 0));
  EXPECT_EQ(rt.device_bytes_in_use(0), 8 * kMiB);
  arena->SetPressureHandler(nullptr);
  rt.ReleaseStream(*stream);
}

TEST(CudaStitchArena, EmptyCacheGivesBackEveryGranuleAndTheAddressSpace) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kStitch);
  const std::uintptr_t a = *arena->Allocate(3 * kMiB, nullptr);
  const std::uintptr_t b = *arena->Allocate(kMiB, nullptr);
  EXPECT_EQ(arena->SegmentOf(b)->base, arena->SegmentOf(a)->base);  // torch's getBaseAllocation: the range
  ASSERT_TRUE(arena->Free(a).ok());
  ASSERT_TRUE(arena->Free(b).ok());
  EXPECT_GT(rt.live_mappings(), 0u);  // freed granules stay mapped for reuse
  ASSERT_TRUE(arena->EmptyCache().ok());
  EXPECT_EQ(rt.live_mappings(), 0u);
  EXPECT_EQ(rt.live_handles(), 0u);
  EXPECT_EQ(rt.live_reservations(), 0u);
  EXPECT_EQ(rt.device_bytes_in_use(0), 0u);
  const DeviceArenaStats stats = arena->Stats();
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_EQ(stats.stitch.handles_created, 2u);  // 3 MiB + 1 MiB: two granules; the counters outlive the arena
  ASSERT_TRUE(arena->Allocate(kMiB, nullptr).ok());  // and it comes back on demand
}

TEST(CudaStitchArena, ADeviceWithoutVirtualMemoryGetsTheContiguousArenaAndSaysWhy) {
  FakeCudaOptions options;
  options.virtual_memory = false;
  FakeCudaRuntime rt(options);
  auto arena = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kStitch);
  ASSERT_TRUE(arena->Allocate(kMiB, nullptr).ok());
  const DeviceArenaStats stats = arena->Stats();
  EXPECT_FALSE(stats.stitched);
  EXPECT_THAT(stats.stitch_fallback, HasSubstr("does not support virtual memory management"));
  EXPECT_EQ(rt.live_device_allocations(), 1u);  // the budget's one cudaMalloc
}

TEST(CudaStitchArena, AGranuleOffTheDevicesGranularityIsAnErrorNamingIt) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kStitch, kMiB);
  const absl::StatusOr<std::uintptr_t> refused = arena->Allocate(1024, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("cannot stitch the CUDA budget of 8388608 bytes on device 0"));
  EXPECT_THAT(refused.status().message(), HasSubstr("granularity (2097152 bytes)"));
}

TEST(CudaStitchArena, BlocksDoNotMove) {
  FakeCudaRuntime rt;
  auto arena = MakeArena(rt, 8 * kMiB, DeviceArenaKind::kStitch);
  const std::uintptr_t a = *arena->Allocate(kMiB, nullptr);
  const absl::Status moved = arena->Move(a, a + 4 * kMiB);
  EXPECT_TRUE(absl::IsFailedPrecondition(moved)) << moved;
  EXPECT_THAT(moved.message(), HasSubstr("does not move blocks"));
}

// Random allocations and frees, each live block filled with its own byte: no two live blocks ever share physical
// memory, whatever was freed, cached and stolen in between.
TEST(CudaStitchArena, RandomAllocationsNeverShareMemoryBetweenLiveBlocks) {
  constexpr std::size_t kSmall = 64 * 1024;
  FakeCudaOptions options;
  options.vmm_granularity = kSmall;
  FakeCudaRuntime rt(options);
  auto arena = MakeArena(rt, 16 * kSmall, DeviceArenaKind::kStitch, kSmall);
  struct Live {
    std::uintptr_t address;
    std::size_t bytes;
    unsigned char fill;
  };
  std::vector<Live> live;
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::size_t> size(512, 3 * kSmall);
  unsigned char next = 1;
  int placed = 0;
  for (int step = 0; step < 600; ++step) {
    if (!live.empty() && (rng() % 3 == 0 || live.size() > 12)) {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(arena->Free(live[i].address).ok());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const std::size_t bytes = size(rng);
      const absl::StatusOr<std::uintptr_t> at = arena->Allocate(bytes, nullptr);
      if (!at.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(at.status())) << at.status();
        continue;
      }
      ++placed;
      std::memset(reinterpret_cast<void*>(*at), next, bytes);
      live.push_back({*at, bytes, next});
      next = static_cast<unsigned char>(next % 250 + 1);
    }
    for (const Live& block : live) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(block.address);
      for (std::size_t k = 0; k < block.bytes; k += 509) ASSERT_EQ(bytes[k], block.fill) << "step " << step;
      ASSERT_EQ(bytes[block.bytes - 1], block.fill) << "step " << step;
    }
    ASSERT_LE(rt.device_bytes_in_use(0), 16 * kSmall);
  }
  EXPECT_GT(placed, 200);
  EXPECT_GT(arena->Stats().stitch.steals, 0u);
}

}  // namespace
}  // namespace remat::cuda
