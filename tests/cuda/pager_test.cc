// CudaPager and PinnedHostPool over the test double: byte-identical round trip, copy-stream ordering, an op
// waiting only for its own pages, and the host pool's budget.
#include "allocator/cuda/pager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::cuda {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  FakeCudaRuntime rt;
  std::unique_ptr<DeviceArena> device;
  std::unique_ptr<PinnedHostPool> host;
  std::unique_ptr<CudaPager> pager;
  explicit Fixture(std::size_t device_budget = 1 << 16, std::size_t host_budget = 4 << 20) {
    DeviceArenaOptions options;
    options.budget = device_budget;
    device = std::move(*DeviceArena::Create(&rt, options));
    host = std::move(*PinnedHostPool::Create(&rt, host_budget));
    pager = std::move(*CudaPager::Create(&rt, device.get(), host.get()));
  }
};

void Fill(std::uintptr_t address, std::size_t bytes, unsigned seed) {
  auto* p = reinterpret_cast<unsigned char*>(address);
  for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed) >> 1);
}

TEST(CudaPager, RoundTripIsByteIdentical) {
  Fixture f;
  cudaStream_t s = *f.rt.StreamCreate();
  const std::size_t bytes = 10000;
  std::uintptr_t a = *f.device->Allocate(bytes, s);
  f.rt.Launch(s, [&] { Fill(a, bytes, 7); });  // the producer kernel
  std::vector<unsigned char> expected(bytes);
  std::memcpy(expected.data(), reinterpret_cast<void*>(a), bytes);

  PageId page = *f.pager->PageOut(a, bytes, s);
  ASSERT_TRUE(f.device->Free(a).ok());  // right away: the copy stream is a recorded user
  // Scribble over the memory the page came from.
  std::uintptr_t other = *f.device->Allocate(f.device->Stats().budget, s);
  f.rt.Launch(s, [&] { std::memset(reinterpret_cast<void*>(other), 0xEE, f.device->Stats().budget); });
  ASSERT_TRUE(f.rt.StreamSynchronize(s).ok());
  ASSERT_TRUE(f.device->Free(other).ok());

  absl::StatusOr<std::uintptr_t> back = f.pager->PageIn(page, s);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(f.pager->WaitForPage(page, s).ok());
  std::vector<unsigned char> got(bytes);
  f.rt.Launch(s, [&] { std::memcpy(got.data(), reinterpret_cast<void*>(*back), bytes); });  // the consumer
  ASSERT_TRUE(f.rt.StreamSynchronize(s).ok());
  EXPECT_EQ(got, expected);
  EXPECT_TRUE(*f.pager->CopyDone(page));
  ASSERT_TRUE(f.pager->Release(page).ok());
  ASSERT_TRUE(f.device->Free(*back).ok());
  EXPECT_EQ(f.pager->Stats().pages_out, 1u);
  EXPECT_EQ(f.pager->Stats().bytes_in, bytes);
}

TEST(CudaPager, CopyOutWaitsForTheProducer) {
  Fixture f;
  cudaStream_t s = *f.rt.StreamCreate();
  const std::size_t bytes = 4096;
  std::uintptr_t a = *f.device->Allocate(bytes, s);
  f.rt.HoldStream(s);
  f.rt.Launch(s, [&] { Fill(a, bytes, 3); });  // not run yet
  PageId page = *f.pager->PageOut(a, bytes, s);
  EXPECT_FALSE(*f.pager->CopyDone(page));  // the copy waits for the producer
  f.rt.ReleaseStream(s);
  EXPECT_TRUE(*f.pager->CopyDone(page));
  std::vector<unsigned char> expected(bytes);
  std::memcpy(expected.data(), reinterpret_cast<void*>(a), bytes);
  ASSERT_TRUE(f.device->Free(a).ok());
  std::uintptr_t back = *f.pager->PageIn(page, s);
  ASSERT_TRUE(f.rt.StreamSynchronize(f.pager->copy_stream()).ok());
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(back), expected.data(), bytes), 0);
  ASSERT_TRUE(f.pager->Release(page).ok());
  ASSERT_TRUE(f.device->Free(back).ok());
}

TEST(CudaPager, AnOpWaitsOnlyForItsOwnInputs) {
  Fixture f;
  cudaStream_t s = *f.rt.StreamCreate();
  std::uintptr_t a = *f.device->Allocate(1024, s);
  std::uintptr_t b = *f.device->Allocate(1024, s);
  PageId pa = *f.pager->PageOut(a, 1024, s);
  PageId pb = *f.pager->PageOut(b, 1024, s);
  ASSERT_TRUE(f.device->Free(a).ok());
  ASSERT_TRUE(f.device->Free(b).ok());
  ASSERT_TRUE(f.rt.StreamSynchronize(f.pager->copy_stream()).ok());

  std::uintptr_t a_in = *f.pager->PageIn(pa, s);
  ASSERT_TRUE(*f.pager->CopyDone(pa));
  f.rt.HoldStream(f.pager->copy_stream());  // b's copy-in will be slow
  std::uintptr_t b_in = *f.pager->PageIn(pb, s);
  EXPECT_FALSE(*f.pager->CopyDone(pb));

  bool op_on_a = false;
  ASSERT_TRUE(f.pager->WaitForPage(pa, s).ok());
  f.rt.Launch(s, [&] { op_on_a = true; });
  EXPECT_TRUE(op_on_a);  // not held up by b
  bool op_on_b = false;
  ASSERT_TRUE(f.pager->WaitForPage(pb, s).ok());
  f.rt.Launch(s, [&] { op_on_b = true; });
  EXPECT_FALSE(op_on_b);  // waits for b's copy
  f.rt.ReleaseStream(f.pager->copy_stream());
  EXPECT_TRUE(op_on_b);
  for (PageId p : {pa, pb}) ASSERT_TRUE(f.pager->Release(p).ok());
  ASSERT_TRUE(f.device->Free(a_in).ok());
  ASSERT_TRUE(f.device->Free(b_in).ok());
}

TEST(CudaPager, WrongStatesAreErrors) {
  Fixture f;
  std::uintptr_t a = *f.device->Allocate(1024, nullptr);
  PageId page = *f.pager->PageOut(a, 1024, nullptr);
  EXPECT_EQ(f.pager->WaitForPage(page, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  std::uintptr_t back = *f.pager->PageIn(page, nullptr);
  EXPECT_EQ(f.pager->PageIn(page, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.pager->Release(page + 100).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.pager->PageOut(0x1234, 16, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(f.pager->Release(page).ok());
  ASSERT_TRUE(f.device->Free(a).ok());
  ASSERT_TRUE(f.device->Free(back).ok());
}

TEST(CudaPinnedHostPool, GrowsUpToItsBudgetAndReusesAfterEvents) {
  FakeCudaRuntime rt;
  auto pool = std::move(*PinnedHostPool::Create(&rt, 4 << 20));
  std::uintptr_t a = *pool->Allocate(3 << 20);
  absl::StatusOr<std::uintptr_t> b = pool->Allocate(2 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("host budget 4194304 bytes"));
  // A block still being copied is freed after its event; under pressure the pool waits for it.
  cudaStream_t s = *rt.StreamCreate();
  cudaEvent_t e = *rt.EventCreate();
  rt.HoldStream(s);
  ASSERT_TRUE(rt.EventRecord(e, s).ok());
  ASSERT_TRUE(pool->FreeAfter(a, e).ok());
  EXPECT_EQ(pool->Stats().pending_blocks, 1u);
  absl::StatusOr<std::uintptr_t> c = pool->Allocate(3 << 20);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(pool->Stats().pending_blocks, 0u);
  EXPECT_LE(pool->Stats().reserved_bytes, 4u << 20);
  ASSERT_TRUE(pool->Free(*c).ok());
}

// Pages of odd sizes take their size rounded to 512 bytes in the pinned pool, not to the next power of two (as
// PyTorch's pinned-memory caching allocator would: 640 KiB + 1 byte would take 1 MiB there).
TEST(CudaPinnedHostPool, PagesTakeTheirSizeNotTheNextPowerOfTwo) {
  Fixture f(std::size_t{4} << 20, std::size_t{8} << 20);
  cudaStream_t s = *f.rt.StreamCreate();
  const std::vector<std::size_t> sizes = {640 * 1024 + 1, 100 * 1024 + 3, 1536 * 1024, 3 * 1024 + 7};
  std::size_t rounded_to_512 = 0;
  std::vector<PageId> pages;
  for (std::size_t bytes : sizes) {
    std::uintptr_t block = *f.device->Allocate(bytes, s);
    absl::StatusOr<PageId> page = f.pager->PageOut(block, bytes, s);
    ASSERT_TRUE(page.ok()) << page.status();
    pages.push_back(*page);
    ASSERT_TRUE(f.device->Free(block).ok());
    rounded_to_512 += (bytes + 511) / 512 * 512;
  }
  EXPECT_EQ(f.host->Stats().allocated_bytes, rounded_to_512);  // 2,335,232 bytes; powers of two: 3,280,896
  for (PageId page : pages) ASSERT_TRUE(f.pager->Release(page).ok());
}

// PageInto copies a page into a block the caller allocated; the consumer's kernel is ordered after the copy only
// through WaitForPage (the double's ordering model sees the race without it).
TEST(CudaPager, PageIntoACallersBlockIsOrderedByWaitForPage) {
  Fixture f;
  cudaStream_t s = *f.rt.StreamCreate();
  const std::size_t bytes = 4096;
  std::uintptr_t a = *f.device->Allocate(bytes, s);
  f.rt.Launch(s, [&] { Fill(a, bytes, 3); });
  std::vector<unsigned char> expected(bytes);
  std::memcpy(expected.data(), reinterpret_cast<void*>(a), bytes);
  PageId page = *f.pager->PageOut(a, bytes, s);
  ASSERT_TRUE(f.device->Free(a).ok());
  std::uintptr_t b = *f.device->Allocate(bytes, s);
  ASSERT_TRUE(f.pager->PageInto(page, b, s).ok());
  EXPECT_EQ(f.pager->PageInto(page, b, s).code(), absl::StatusCode::kFailedPrecondition);  // already in
  const std::uint64_t races = f.rt.counters().races;
  f.rt.LaunchKernel(s, {{b, bytes}}, {}, "unordered reader");
  EXPECT_EQ(f.rt.counters().races, races + 1);
  ASSERT_TRUE(f.pager->WaitForPage(page, s).ok());
  f.rt.LaunchKernel(s, {{b, bytes}}, {}, "ordered reader");
  EXPECT_EQ(f.rt.counters().races, races + 1);
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(b), expected.data(), bytes), 0);
  ASSERT_TRUE(f.pager->Release(page).ok());
  ASSERT_TRUE(f.device->Free(b).ok());
}

}  // namespace
}  // namespace remat::cuda
