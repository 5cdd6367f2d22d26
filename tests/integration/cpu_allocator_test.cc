// CPU allocator: install/uninstall with c10, the budget as a hard limit (OutOfMemoryError naming the request),
// stats, the pressure handler, and memory that crosses an install boundary going back to whoever allocated it.
#include "integration/cpu_allocator.h"

#include <ATen/MapAllocator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/ones.h>
#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

namespace remat::integration {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool InArena(const at::Tensor& t) {
  Arena* arena = InstalledCpuArena();
  return arena != nullptr && arena->Block(reinterpret_cast<std::uintptr_t>(t.storage().data())).ok();
}

class CpuAllocatorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (CpuArenaInstalled()) {
      EXPECT_TRUE(UninstallCpuArena().ok());
    }
    SetCpuPressureHandler(nullptr);
  }
};

TEST_F(CpuAllocatorTest, InstallReplacesTorchsCpuAllocatorAndUninstallRestoresIt) {
  c10::Allocator* original = c10::GetCPUAllocator();
  ASSERT_NE(original, RematCpuAllocator());
  at::Tensor before = at::ones({1000});

  ASSERT_TRUE(InstallCpuArena(16 * kMiB).ok());
  EXPECT_TRUE(CpuArenaInstalled());
  EXPECT_EQ(c10::GetCPUAllocator(), RematCpuAllocator());
  EXPECT_EQ(InstallCpuArena(16 * kMiB).code(), absl::StatusCode::kAlreadyExists);
  at::Tensor during = at::ones({1000});
  EXPECT_TRUE(InArena(during));
  EXPECT_FALSE(InArena(before));
  EXPECT_TRUE(AllocatedByRematArena(during.storage().data_ptr()));
  EXPECT_FALSE(AllocatedByRematArena(before.storage().data_ptr()));
  float outside[4] = {1, 2, 3, 4};
  at::Tensor blob = at::from_blob(outside, {4});
  EXPECT_FALSE(AllocatedByRematArena(blob.storage().data_ptr())) << "from_blob memory is not remat's";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(during.const_data_ptr()) % kCpuAlignment, 0u);
  EXPECT_EQ(during.storage().data_ptr().get_context(), during.storage().data_ptr().get());
  before.reset();  // allocated by torch's allocator: its own deleter frees it while the arena is installed

  ASSERT_TRUE(UninstallCpuArena().ok());
  EXPECT_EQ(c10::GetCPUAllocator(), original);
  EXPECT_EQ(LiveCpuArenaCount(), 1u);
  EXPECT_EQ(UninstallCpuArena().code(), absl::StatusCode::kFailedPrecondition);
  at::Tensor after = at::ones({1000});
  EXPECT_NE(after.storage().data_ptr().get_deleter(), RematCpuAllocator()->raw_deleter());
  EXPECT_FALSE(AllocatedByRematArena(after.storage().data_ptr()));
  EXPECT_TRUE(AllocatedByRematArena(during.storage().data_ptr())) << "retired arenas still own their blocks";
  // A tensor made under the arena outlives it and still works; its storage's allocator (ours) now forwards.
  EXPECT_EQ(during.sum().item<float>(), 1000.0f);
  during.resize_({1 << 20});
  EXPECT_FALSE(AllocatedByRematArena(during.storage().data_ptr())) << "forwarded to torch's allocator";
  during.fill_(2.0f);
  EXPECT_EQ(during.const_data_ptr<float>()[(1 << 20) - 1], 2.0f);
  during.reset();
  after.reset();
}

TEST_F(CpuAllocatorTest, PriorityIsLeftAsItWas) {
  c10::Allocator* original = c10::GetCPUAllocator();
  ASSERT_TRUE(InstallCpuArena(kMiB).ok());
  ASSERT_TRUE(UninstallCpuArena().ok());
  // A priority-0 registration (what torch itself uses) must still win after an install/uninstall pair.
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), 0);
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  c10::SetCPUAllocator(original, 0);
  EXPECT_EQ(c10::GetCPUAllocator(), original);
}

TEST_F(CpuAllocatorTest, StatsCountAlignedBlocksAndPeak) {
  ASSERT_TRUE(InstallCpuArena(4 * kMiB).ok());
  {
    at::Tensor a = at::empty({1000}, at::kByte);  // 1000 -> 1024 bytes
    at::Tensor b = at::empty({kMiB / 4}, at::kFloat);
    absl::StatusOr<CpuArenaStats> stats = GetCpuArenaStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_TRUE(stats->installed);
    EXPECT_EQ(stats->budget, 4 * kMiB);
    EXPECT_EQ(stats->allocated_bytes, 1024 + kMiB);
    EXPECT_GE(stats->reserved_bytes, 4 * kMiB);
    EXPECT_EQ(stats->free_bytes, stats->reserved_bytes - stats->allocated_bytes);
  }
  absl::StatusOr<CpuArenaStats> stats = GetCpuArenaStats();
  EXPECT_EQ(stats->allocated_bytes, 0u);
  EXPECT_EQ(stats->peak_allocated_bytes, 1024 + kMiB);
  EXPECT_EQ(stats->allocations, stats->frees);
  ASSERT_TRUE(ResetCpuArenaPeak().ok());
  EXPECT_EQ(GetCpuArenaStats()->peak_allocated_bytes, 0u);
  ASSERT_TRUE(UninstallCpuArena().ok());
  stats = GetCpuArenaStats();
  ASSERT_TRUE(stats.ok()) << "the last arena's numbers stay readable after uninstall";
  EXPECT_FALSE(stats->installed);
  EXPECT_EQ(stats->budget, 4 * kMiB);
}

TEST_F(CpuAllocatorTest, ExceedingTheBudgetRaisesOutOfMemoryNamingTheRequest) {
  ASSERT_TRUE(InstallCpuArena(kMiB).ok());
  at::Tensor held = at::empty({600 * 1024}, at::kByte);
  EXPECT_THAT([] { (void)at::empty({600 * 1024}, at::kByte); },
              testing::ThrowsMessage<c10::OutOfMemoryError>(
                  testing::AllOf(HasSubstr("tried to allocate 614400 bytes"), HasSubstr("budget 1048576"),
                                 HasSubstr("largest free block"),
                                 testing::Not(HasSubstr("larger than the whole budget")))));
  EXPECT_EQ(GetCpuArenaStats()->failed_allocations, 1u);
  // A request above the whole budget says so: no eviction could make room for it.
  EXPECT_THAT([] { (void)at::empty({static_cast<std::int64_t>(kMiB) + 4096}, at::kByte); },
              testing::ThrowsMessage<c10::OutOfMemoryError>(
                  HasSubstr("This one request is larger than the whole budget (by 4096 bytes)")));
  EXPECT_LE(GetCpuArenaStats()->peak_allocated_bytes, kMiB);
  held.reset();
  EXPECT_NO_THROW((void)at::empty({600 * 1024}, at::kByte)) << "the memory came back";
}

class ReleasingHandler : public PressureHandler {
 public:
  explicit ReleasingHandler(at::Tensor* victim) : victim_(victim) {}
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) override {
    ++calls;
    if (!victim_->defined()) return false;
    victim_->reset();  // frees through our deleter, which calls Arena::Free
    return true;
  }
  int calls = 0;

 private:
  at::Tensor* victim_;
};

TEST_F(CpuAllocatorTest, PressureHandlerMakesRoom) {
  at::Tensor victim;
  ReleasingHandler handler(&victim);
  SetCpuPressureHandler(&handler);
  ASSERT_TRUE(InstallCpuArena(kMiB).ok());
  victim = at::empty({700 * 1024}, at::kByte);
  at::Tensor needs_room = at::empty({700 * 1024}, at::kByte);
  EXPECT_EQ(handler.calls, 1);
  EXPECT_FALSE(victim.defined());
  EXPECT_TRUE(InArena(needs_room));
  EXPECT_EQ(GetCpuArenaStats()->pressure_allocations, 1u);
  EXPECT_THROW((void)at::empty({700 * 1024}, at::kByte), c10::OutOfMemoryError) << "nothing left to release";
  EXPECT_EQ(handler.calls, 2);
}

TEST_F(CpuAllocatorTest, TryAllocateTakesTheHighestHoleAndNeverAsksTheHandler) {
  at::Tensor victim;
  ReleasingHandler handler(&victim);
  SetCpuPressureHandler(&handler);
  ASSERT_TRUE(InstallCpuArena(kMiB).ok());
  // The arena's first address: where the first block goes (a temporary, freed at once).
  const auto base = reinterpret_cast<std::uintptr_t>(at::empty({64}, at::kByte).storage().data());
  // Four 256 KiB blocks fill the arena; free the 1st and the 3rd: holes at offsets 0 and 512 KiB.
  std::vector<at::Tensor> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(at::empty({256 * 1024}, at::kByte));
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(blocks[0].storage().data()), base);
  blocks[0].reset();
  blocks[2].reset();
  c10::DataPtr top = TryAllocateInCpuArena(1024, Placement::kTop);
  ASSERT_NE(top.get(), nullptr);
  // The high end of the higher hole [512 KiB, 768 KiB).
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(top.get()), base + 768 * 1024 - 1024);
  victim = blocks[1];
  blocks[1].reset();
  // 512 KiB does not fit in any hole: no block, and the handler (which would free `victim`) is not asked.
  EXPECT_EQ(TryAllocateInCpuArena(512 * 1024, Placement::kTop).get(), nullptr);
  EXPECT_EQ(handler.calls, 0);
  EXPECT_TRUE(victim.defined());
}

TEST_F(CpuAllocatorTest, AnUnalignedBudgetIsRoundedDownNeverUp) {
  // Not a multiple of the 64-byte block (down to kMiB + 4160) nor of the 4 KiB page the host provider reserves
  // (kMiB + 8192): the arena holds kMiB + 4160 bytes.
  ASSERT_TRUE(InstallCpuArena(kMiB + 4160 + 48).ok());
  EXPECT_EQ(GetCpuArenaStats()->reserved_bytes, kMiB + 4160);
  EXPECT_TRUE(UninstallCpuArena().ok());
  ASSERT_TRUE(InstallCpuArena(kMiB + 48).ok());
  EXPECT_EQ(GetCpuArenaStats()->reserved_bytes, kMiB);
  EXPECT_THROW((void)at::empty({static_cast<std::int64_t>(kMiB + 48)}, at::kByte), c10::OutOfMemoryError);
  EXPECT_TRUE(UninstallCpuArena().ok());
  EXPECT_EQ(InstallCpuArena(63).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuAllocatorTest, RawInterfaceAndZeroBytes) {
  ASSERT_TRUE(InstallCpuArena(kMiB).ok());
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  void* raw = allocator->raw_allocate(100);
  EXPECT_EQ(GetCpuArenaStats()->allocated_bytes, 128u);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(GetCpuArenaStats()->allocated_bytes, 0u);
  at::Tensor empty = at::empty({0});
  EXPECT_EQ(GetCpuArenaStats()->allocated_bytes, 0u);
  EXPECT_TRUE(allocator->is_simple_data_ptr(allocator->allocate(8)));
}

TEST_F(CpuAllocatorTest, BorrowedMemoryIsMemoryTorchDidNotAllocate) {
  at::Tensor before = at::ones({1000});  // torch's allocator, before remat's
  ASSERT_TRUE(InstallCpuArena(16 * kMiB).ok());
  at::Tensor during = at::ones({1000});
  float outside[4] = {1, 2, 3, 4};
  at::Tensor blob = at::from_blob(outside, {4});  // torch.from_numpy, DLPack and frombuffer borrow so
  at::Tensor owned_blob = at::from_blob(outside, {4}, [](void*) {});
  EXPECT_FALSE(BorrowedCpuMemory(before.storage().data_ptr()));
  EXPECT_FALSE(BorrowedCpuMemory(during.storage().data_ptr()));
  EXPECT_TRUE(BorrowedCpuMemory(blob.storage().data_ptr()));
  EXPECT_TRUE(BorrowedCpuMemory(owned_blob.storage().data_ptr()));
  EXPECT_FALSE(BorrowedCpuMemory(at::empty({0}).storage().data_ptr())) << "no bytes, nothing to rewrite";
  // torch's shared memory (share_memory_(), a DataLoader worker's batch) is torch's own.
  at::DataPtr shared = at::MapAllocator::makeDataPtr(at::NewProcessWideShmHandle(), at::ALLOCATOR_MAPPED_SHAREDMEM |
                                                                                       at::ALLOCATOR_MAPPED_EXCLUSIVE,
                                                     4096, nullptr);
  EXPECT_FALSE(BorrowedCpuMemory(shared));
  before.reset();
  during.reset();
}

TEST_F(CpuAllocatorTest, RepeatedInstallsWithTensorsCrossingThem) {
  std::vector<at::Tensor> survivors;
  ASSERT_EQ(LiveCpuArenaCount(), 0u);
  for (int round = 0; round < 5; ++round) {
    ASSERT_TRUE(InstallCpuArena(64 * kMiB).ok()) << round;
    survivors.push_back(at::ones({1000 + round}));
    ASSERT_TRUE(UninstallCpuArena().ok());
  }
  EXPECT_EQ(LiveCpuArenaCount(), 5u) << "a retired arena lives while a tensor uses it";
  for (int round = 0; round < 5; ++round) EXPECT_EQ(survivors[round].sum().item<float>(), 1000.0f + round);
  survivors.pop_back();
  EXPECT_EQ(LiveCpuArenaCount(), 4u);
  survivors.clear();
  EXPECT_EQ(LiveCpuArenaCount(), 0u) << "each retired arena goes away with its last tensor";
}

}  // namespace
}  // namespace remat::integration
