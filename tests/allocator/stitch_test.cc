// Stitching (ArenaOptions::granule, allocator/granule_map.h): the budget counts mapped granules; a granule is
// mapped while an allocated block overlaps it and the provider is told exactly when; a request needs free
// granules, not a hole, so scattered frees make room for one large block.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

#include "allocator/arena.h"
#include "allocator/granule_map.h"
#include "allocator/memory_provider.h"

namespace remat {
namespace {

constexpr std::size_t kGranule = 4096;

// Bytes of this process's memory resident in [low, high), from /proc/self/smaps.
std::size_t ResidentBytesIn(std::uintptr_t low, std::uintptr_t high) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  std::size_t total = 0;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2) {  // a mapping's first line
      inside = start < high && end > low;
      continue;
    }
    unsigned long kb = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %lu kB", &kb) == 1) total += kb * 1024;
  }
  return total;
}

TEST(GranuleMapTest, CountsWholeAndSharedGranulesOnce) {
  GranuleMap map(kGranule, 100 * kGranule);
  std::vector<GranuleRange> mapped, unmapped;
  // Two small blocks in granule 0, a block over granules 0 (end), 1, 2 and 3 (start).
  map.Add(0, 100, &mapped);
  EXPECT_EQ(map.NewGranules(100, 100), 0u);  // granule 0 is mapped already
  map.Add(100, 100, &mapped);
  EXPECT_EQ(map.NewGranules(kGranule - 8, 2 * kGranule + 16), 3u);  // granules 1 and 2 whole, 3 in part
  map.Add(kGranule - 8, 2 * kGranule + 16, &mapped);
  EXPECT_EQ(map.mapped_bytes(), 4 * kGranule);
  // Mapped: granule 0 once, then granules 1 and 2 (whole, one range), then granule 3.
  ASSERT_EQ(mapped.size(), 3u);
  EXPECT_EQ(mapped[0].address, 0u);
  EXPECT_EQ(mapped[1].address, kGranule);
  EXPECT_EQ(mapped[1].bytes, 2 * kGranule);
  EXPECT_EQ(mapped[2].address, 3 * kGranule);
  map.Remove(0, 100, &unmapped);
  EXPECT_TRUE(unmapped.empty());  // granule 0 still has users
  map.Remove(kGranule - 8, 2 * kGranule + 16, &unmapped);
  map.Remove(100, 100, &unmapped);
  EXPECT_EQ(map.mapped_bytes(), 0u);
  std::size_t bytes = 0;
  for (const GranuleRange& r : unmapped) bytes += r.bytes;
  EXPECT_EQ(bytes, 4 * kGranule);
  EXPECT_EQ(map.peak_bytes(), 4 * kGranule);
}

// A virtual provider that records Map/Unmap and checks they balance per granule.
class RecordingProvider final : public MemoryProvider {
 public:
  explicit RecordingProvider(std::unique_ptr<MemoryProvider> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) override {
    return inner_->Reserve(bytes, alignment);
  }
  void Release(const Segment& s) override { inner_->Release(s); }
  bool BacksMemory() const override { return false; }
  std::string_view Name() const override { return "recording"; }
  absl::Status Map(std::uintptr_t address, std::size_t bytes) override {
    if (fail_maps_ > 0) {
      --fail_maps_;
      return absl::ResourceExhaustedError("recording provider: no physical memory");
    }
    for (std::uintptr_t g = address; g < address + bytes; g += kGranule) EXPECT_TRUE(mapped_.insert(g).second);
    return absl::OkStatus();
  }
  void Unmap(std::uintptr_t address, std::size_t bytes) override {
    for (std::uintptr_t g = address; g < address + bytes; g += kGranule) EXPECT_EQ(mapped_.erase(g), 1u);
  }
  std::size_t mapped_granules() const { return mapped_.size(); }
  int fail_maps_ = 0;

 private:
  std::unique_ptr<MemoryProvider> inner_;
  absl::flat_hash_set<std::uintptr_t> mapped_;
};

struct Stitched {
  Stitched(std::size_t limit_granules) {
    auto p = std::make_unique<RecordingProvider>(MakeVirtualProvider());
    provider = p.get();
    ArenaOptions o;
    o.alignment = 512;
    o.capacity = 16 * limit_granules * kGranule;  // address space to spare
    o.grow = true;
    o.granule = kGranule;
    o.physical_limit = limit_granules * kGranule;
    arena = *Arena::Create(std::move(p), o);
  }
  RecordingProvider* provider;
  std::unique_ptr<Arena> arena;
};

// Frees every other block it is asked to, as an engine would evict the cheapest.
class FreeList final : public PressureHandler {
 public:
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t) override {
    if (victims.empty()) return false;
    const std::uintptr_t a = victims.back();
    victims.pop_back();
    ++calls;
    return arena.Free(a).ok();
  }
  std::vector<std::uintptr_t> victims;
  int calls = 0;
};

TEST(StitchedArenaTest, ScatteredFreesMakeRoomForOneLargeBlockWithoutAHole) {
  Stitched s(8);
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(*s.arena->Allocate(kGranule, i + 1));
  EXPECT_EQ(s.arena->Stats().physical_bytes, 8 * kGranule);
  EXPECT_EQ(s.provider->mapped_granules(), 8u);
  // Every other block goes: 4 granules free, no two adjacent. A 4-granule request fits, in fresh address space.
  FreeList handler;
  for (int i = 0; i < 8; i += 2) handler.victims.push_back(blocks[i]);
  s.arena->SetPressureHandler(&handler);
  absl::StatusOr<std::uintptr_t> big = s.arena->Allocate(4 * kGranule, 100);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(handler.calls, 4);
  EXPECT_EQ(s.arena->Stats().physical_bytes, 8 * kGranule);
  EXPECT_EQ(s.arena->Stats().peak_physical_bytes, 8 * kGranule);
  EXPECT_EQ(s.arena->PeakBudgetedBytes(), 8 * kGranule);
  EXPECT_EQ(s.provider->mapped_granules(), 8u);
  s.arena->SetPressureHandler(nullptr);
}

TEST(StitchedArenaTest, TheLimitCountsGranulesNotBytesAndErrorsSayPhysical) {
  Stitched s(2);
  // Small blocks share a granule: 8 of 512 bytes map one granule.
  std::vector<std::uintptr_t> small;
  for (int i = 0; i < 8; ++i) small.push_back(*s.arena->Allocate(512, i + 1));
  EXPECT_EQ(s.arena->Stats().physical_bytes, kGranule);
  ASSERT_TRUE(s.arena->Allocate(kGranule, 50).ok());
  absl::StatusOr<std::uintptr_t> more = s.arena->Allocate(kGranule, 51);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("physical bytes mapped"), std::string::npos) << more.status();
  absl::StatusOr<std::uintptr_t> huge = s.arena->Allocate(3 * kGranule, 52);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("larger than the physical limit"), std::string::npos) << huge.status();
  // Blocks never move in a stitching arena.
  EXPECT_EQ(s.arena->Move(small[0], small[0]).code(), absl::StatusCode::kFailedPrecondition);
}

// A block goes where it maps the fewest new granules: with every granule of the limit in use, a small request asked
// at the high end of the free space (fresh address space) goes to the low end, inside a granule already mapped.
TEST(StitchedArenaTest, ABlockGoesWhereItMapsTheFewestNewGranules) {
  Stitched s(2);
  const std::uintptr_t base = *s.arena->Allocate(512, 1);  // granule 0
  ASSERT_TRUE(s.arena->Allocate(kGranule, 2).ok());          // the rest of granule 0 and the start of granule 1
  EXPECT_EQ(s.arena->Stats().physical_bytes, 2 * kGranule);
  absl::StatusOr<std::uintptr_t> small = s.arena->Allocate(1024, 3, Placement::kHigh);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, base + 512 + kGranule);  // right after the second block, in granule 1
  EXPECT_EQ(s.arena->Stats().physical_bytes, 2 * kGranule);
  EXPECT_EQ(s.provider->mapped_granules(), 2u);
}

TEST(StitchedArenaTest, AFailedMappingFailsTheAllocationAndLeavesNothingMapped) {
  Stitched s(4);
  s.provider->fail_maps_ = 1;
  absl::StatusOr<std::uintptr_t> a = s.arena->TryAllocate(2 * kGranule, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("no physical memory"), std::string::npos) << a.status();
  EXPECT_EQ(s.arena->Stats().physical_bytes, 0u);
  EXPECT_EQ(s.arena->Stats().allocated_bytes, 0u);
  EXPECT_EQ(s.provider->mapped_granules(), 0u);
  ASSERT_TRUE(s.arena->TryAllocate(2 * kGranule, 1).ok());  // the next one maps
  EXPECT_EQ(s.provider->mapped_granules(), 2u);
}

TEST(StitchedArenaTest, RejectsAGranuleThatIsNoPowerOfTwoOrALimitBelowOne) {
  ArenaOptions o;
  o.alignment = 512;
  o.granule = 3000;
  o.physical_limit = 1 << 20;
  EXPECT_FALSE(Arena::Create(MakeVirtualProvider(), o).ok());
  o.granule = kGranule;
  o.physical_limit = 100;
  EXPECT_FALSE(Arena::Create(MakeVirtualProvider(), o).ok());
}

// The CPU's stitching provider, for real: blocks are readable and writable memory, a large block stitched from
// granules freed all over the address space holds its bytes, and blocks that stay keep theirs.
TEST(StitchHostProviderTest, BlocksStitchedFromScatteredGranulesHoldTheirBytes) {
  constexpr std::size_t kG = 64 << 10;
  absl::StatusOr<std::unique_ptr<MemoryProvider>> provider = MakeStitchHostProvider(8 * kG, kG);
  ASSERT_TRUE(provider.ok()) << provider.status();
  ArenaOptions o;
  o.alignment = 64;
  o.capacity = 64 * kG;
  o.granule = kG;
  o.physical_limit = 8 * kG;
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(std::move(*provider), o);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(*(*arena)->TryAllocate(kG, i + 1));
    std::memset(reinterpret_cast<void*>(blocks.back()), 'a' + i, kG);
  }
  EXPECT_FALSE((*arena)->TryAllocate(kG, 9).ok());  // eight granules: the pool is full
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE((*arena)->Free(blocks[i]).ok());
  absl::StatusOr<std::uintptr_t> big = (*arena)->TryAllocate(4 * kG, 10);
  ASSERT_TRUE(big.ok()) << big.status();
  std::memset(reinterpret_cast<void*>(*big), 'z', 4 * kG);
  for (int i = 1; i < 8; i += 2) {
    const char* p = reinterpret_cast<const char*>(blocks[i]);
    EXPECT_EQ(p[0], 'a' + i);
    EXPECT_EQ(p[kG - 1], 'a' + i);
  }
  const char* z = reinterpret_cast<const char*>(*big);
  EXPECT_EQ(z[0], 'z');
  EXPECT_EQ(z[4 * kG - 1], 'z');
  EXPECT_EQ((*arena)->Stats().physical_bytes, 8 * kG);
  // The process holds no more than the pool: the granules freed and taken again gave their memory back.
  EXPECT_LE(ResidentBytesIn(blocks[0], *big + 4 * kG), 8 * kG);
  ASSERT_TRUE((*arena)->Free(*big).ok());
  EXPECT_EQ((*arena)->Stats().physical_bytes, 4 * kG);
}

// A forked child (a DataLoader worker) writing a block it inherited must not change the parent's bytes, and the
// parent's later writes must not reach the child: stitched memory is private, copied on write, like any allocator's.
TEST(StitchHostProviderTest, AForkedChildsWritesStayInTheChild) {
  constexpr std::size_t kG = 64 << 10;
  ArenaOptions o;
  o.alignment = 64;
  o.capacity = 16 * kG;
  o.granule = kG;
  o.physical_limit = 4 * kG;
  std::unique_ptr<Arena> arena = *Arena::Create(*MakeStitchHostProvider(4 * kG, kG), o);
  char* block = reinterpret_cast<char*>(*arena->TryAllocate(2 * kG, 1));
  std::memset(block, 'p', 2 * kG);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::memset(block, 'c', 2 * kG);
    char go = 0;
    if (write(to_parent[1], &go, 1) != 1 || read(to_child[0], &go, 1) != 1) _exit(3);
    _exit(block[0] == 'c' && block[2 * kG - 1] == 'c' ? 0 : 4);  // the parent wrote 'q' meanwhile
  }
  char go = 0;
  ASSERT_EQ(read(to_parent[0], &go, 1), 1);
  EXPECT_EQ(block[0], 'p');
  EXPECT_EQ(block[2 * kG - 1], 'p');
  std::memset(block, 'q', 2 * kG);
  ASSERT_EQ(write(to_child[1], &go, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child saw the parent's write (or failed to talk)";
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

TEST(StitchHostProviderTest, RejectsAGranuleThatIsNotAPageMultiple) {
  EXPECT_FALSE(MakeStitchHostProvider(1 << 20, 1000).ok());
  EXPECT_FALSE(MakeStitchHostProvider(1 << 20, 512).ok());
  EXPECT_FALSE(MakeStitchHostProvider(100, 64 << 10).ok());
}

}  // namespace
}  // namespace remat
