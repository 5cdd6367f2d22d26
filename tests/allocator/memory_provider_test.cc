// Tests for the memory providers (allocator/memory_provider.h): alignment, non-zero bases, disjoint segments,
// real memory behind the host provider's segments, and clear errors for bad requests.
#include "allocator/memory_provider.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

TEST(VirtualProviderTest, SegmentsAreAlignedNonZeroAndDisjoint) {
  auto p = MakeVirtualProvider();
  auto q = MakeVirtualProvider();
  EXPECT_FALSE(p->BacksMemory());
  EXPECT_EQ(p->Name(), "virtual");
  std::vector<Segment> segs;
  for (std::size_t align : {64, 512, 4096, 1 << 21}) {
    for (auto* provider : {p.get(), q.get()}) {
      auto s = provider->Reserve(1000 + align, align);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_NE(s->base, 0u);
      EXPECT_EQ(s->base % align, 0u);
      EXPECT_GE(s->size, 1000 + align);
      segs.push_back(*s);
    }
  }
  std::sort(segs.begin(), segs.end(), [](const Segment& x, const Segment& y) { return x.base < y.base; });
  for (std::size_t i = 1; i < segs.size(); ++i) {
    // Disjoint, and never touching: an arena must not see two segments as one run.
    EXPECT_GT(segs[i].base, segs[i - 1].base + segs[i - 1].size);
  }
  for (const auto& s : segs) p->Release(s);
}

TEST(VirtualProviderTest, HugeSegmentsCostNothing) {
  auto p = MakeVirtualProvider();
  auto s = p->Reserve(std::size_t{1} << 40, 512);  // 1 TiB of addresses, no memory
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->size, std::size_t{1} << 40);
  p->Release(*s);
}

TEST(VirtualProviderTest, RejectsBadRequests) {
  auto p = MakeVirtualProvider();
  EXPECT_EQ(p->Reserve(0, 512).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->Reserve(512, 3).status().code(), absl::StatusCode::kInvalidArgument);
  auto huge = p->Reserve(std::size_t{1} << 63, 512);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("virtual provider"));
}

TEST(HostProviderTest, SmallAndLargeSegmentsAreAlignedAndWritable) {
  auto p = MakeHostProvider();
  EXPECT_TRUE(p->BacksMemory());
  EXPECT_EQ(p->Name(), "host");
  // Below and above the mmap threshold, with alignments below and above the page size.
  for (std::size_t bytes : {std::size_t{1000}, std::size_t{64} << 10, std::size_t{3} << 20}) {
    for (std::size_t align : {1, 8, 64, 512, 4096, 1 << 21}) {
      auto s = p->Reserve(bytes, align);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(s->base % align, 0u) << bytes << " " << align;
      ASSERT_GE(s->size, bytes);
      auto* mem = reinterpret_cast<unsigned char*>(s->base);
      std::memset(mem, 0x5a, s->size);
      EXPECT_EQ(mem[0], 0x5a);
      EXPECT_EQ(mem[s->size - 1], 0x5a);
      p->Release(*s);
    }
  }
}

TEST(HostProviderTest, ReservingIsLazyForLargeSegments) {
  // 64 GiB of address space with MAP_NORESERVE: fine as long as nothing is touched.
  auto p = MakeHostProvider();
  auto s = p->Reserve(std::size_t{64} << 30, 512);
  ASSERT_TRUE(s.ok()) << "a lazy 64 GiB reservation failed: " << s.status();
  reinterpret_cast<unsigned char*>(s->base)[0] = 1;  // one page
  p->Release(*s);
}

TEST(HostProviderTest, RejectsBadRequests) {
  auto p = MakeHostProvider();
  EXPECT_EQ(p->Reserve(0, 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->Reserve(64, 48).status().code(), absl::StatusCode::kInvalidArgument);
  auto huge = p->Reserve(std::size_t{1} << 62, 64);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("host provider"));
}

TEST(HostProviderDeathTest, ReleasingAForeignSegmentAborts) {
  auto p = MakeHostProvider();
  int x = 0;
  EXPECT_DEATH(p->Release(Segment{reinterpret_cast<std::uintptr_t>(&x), sizeof(x)}), "did not reserve");
}

}  // namespace
}  // namespace remat
