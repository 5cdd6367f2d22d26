// CudaStitchProvider on the CUDA runtime's double: the order of the driver's virtual memory calls, access rights
// before use, freed granules kept mapped until another range needs their memory, the wait for the device before
// such a steal, and releasing everything in the driver's order.
#include "allocator/cuda/cuda_stitch_provider.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::cuda {
namespace {

using ::testing::HasSubstr;
using Kind = VmmCall::Kind;

constexpr std::size_t kGranule = std::size_t{2} << 20;

std::vector<Kind> KindsOf(const std::vector<VmmCall>& log, std::size_t from = 0) {
  std::vector<Kind> kinds;
  for (std::size_t i = from; i < log.size(); ++i) kinds.push_back(log[i].kind);
  return kinds;
}

std::unique_ptr<CudaStitchProvider> Make(FakeCudaRuntime* rt, std::size_t granules) {
  absl::StatusOr<std::unique_ptr<CudaStitchProvider>> made = MakeCudaStitchProvider(rt, 0, granules * kGranule,
                                                                                    kGranule);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

TEST(CudaStitchProvider, MapsEachGranuleThenGrantsAccessBeforeTheRangeIsUsed) {
  FakeCudaRuntime rt;
  auto provider = Make(&rt, 4);
  absl::StatusOr<Segment> segment = provider->Reserve(8 * kGranule, 512);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->base % kGranule, 0u);
  EXPECT_EQ(rt.device_bytes_in_use(0), 0u);  // address space only
  const std::uintptr_t at = segment->base + 2 * kGranule;
  ASSERT_TRUE(provider->Map(at, 2 * kGranule).ok());
  EXPECT_EQ(KindsOf(rt.vmm_log()), (std::vector<Kind>{Kind::kReserve, Kind::kCreate, Kind::kMap, Kind::kSetAccess,
                                                      Kind::kCreate, Kind::kMap, Kind::kSetAccess}));
  const std::vector<VmmCall> log = rt.vmm_log();
  EXPECT_EQ(log[2].address, at);
  EXPECT_EQ(log[5].address, at + kGranule);
  EXPECT_EQ(log[3].device, 0);
  EXPECT_TRUE(rt.Accessible(at, 2 * kGranule, 0));
  EXPECT_FALSE(rt.Accessible(segment->base, kGranule, 0));
  EXPECT_EQ(rt.device_bytes_in_use(0), 2 * kGranule);
  // The range is real memory, contiguous across the two granules.
  std::memset(reinterpret_cast<void*>(at), 0x5A, 2 * kGranule);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(at)[2 * kGranule - 1], 0x5A);
  EXPECT_EQ(provider->counters().maps, 2u);
  EXPECT_EQ(provider->counters().handles_created, 2u);
}

TEST(CudaStitchProvider, FreedGranulesStayMappedUntilAnotherRangeNeedsTheirMemory) {
  FakeCudaRuntime rt;
  auto provider = Make(&rt, 2);  // the pool: two granules
  absl::StatusOr<Segment> segment = provider->Reserve(8 * kGranule, kGranule);
  ASSERT_TRUE(segment.ok());
  const std::uintptr_t a = segment->base, b = segment->base + 4 * kGranule;
  ASSERT_TRUE(provider->Map(a, 2 * kGranule).ok());
  std::memset(reinterpret_cast<void*>(a), 0x11, 2 * kGranule);
  provider->Unmap(a, 2 * kGranule);
  const std::size_t calls = rt.vmm_log().size();
  EXPECT_EQ(rt.live_mappings(), 2u);  // still mapped: no driver call on free
  ASSERT_TRUE(provider->Map(a, 2 * kGranule).ok());
  EXPECT_EQ(rt.vmm_log().size(), calls);  // placed there again: no driver call either
  EXPECT_EQ(provider->counters().cache_hits, 2u);
  provider->Unmap(a, 2 * kGranule);
  // Another range needs the memory: the host waits for the device once, then each granule moves.
  ASSERT_TRUE(provider->Map(b, 2 * kGranule).ok());
  EXPECT_EQ(KindsOf(rt.vmm_log(), calls), (std::vector<Kind>{Kind::kUnmap, Kind::kMap, Kind::kSetAccess, Kind::kUnmap,
                                                             Kind::kMap, Kind::kSetAccess}));
  EXPECT_EQ(rt.counters().device_synchronizations, 1u);
  EXPECT_EQ(provider->counters().steals, 2u);
  EXPECT_EQ(provider->counters().handles_created, 2u);  // never more than the pool
  EXPECT_FALSE(rt.Accessible(a, kGranule, 0));
  EXPECT_TRUE(rt.Accessible(b, 2 * kGranule, 0));
  EXPECT_EQ(rt.device_bytes_in_use(0), 2 * kGranule);
  // The physical memory moved with its handle (contents are not promised, but they are the same bytes).
  EXPECT_EQ(reinterpret_cast<unsigned char*>(b)[0], 0x11);
}

TEST(CudaStitchProvider, AStealWaitsForQueuedWorkOnTheFreedRange) {
  FakeCudaRuntime rt;
  auto provider = Make(&rt, 1);
  absl::StatusOr<Segment> segment = provider->Reserve(4 * kGranule, kGranule);
  ASSERT_TRUE(segment.ok());
  const std::uintptr_t a = segment->base, b = segment->base + 2 * kGranule;
  ASSERT_TRUE(provider->Map(a, kGranule).ok());
  absl::StatusOr<cudaStream_t> stream = rt.StreamCreate();
  ASSERT_TRUE(stream.ok());
  rt.HoldStream(*stream);  // the GPU has not reached this kernel yet
  bool ran = false;
  rt.Launch(*stream, a, kGranule, [&] {
    std::memset(reinterpret_cast<void*>(a), 0x22, 64);
    ran = true;
  });
  provider->Unmap(a, kGranule);  // freed in stream order: the kernel may still run
  // The double refuses an unmap under queued work that uses the range: the provider must wait first.
  ASSERT_TRUE(provider->Map(b, kGranule).ok());
  EXPECT_TRUE(ran);
  EXPECT_EQ(rt.counters().device_synchronizations, 1u);
  EXPECT_EQ(rt.counters().faults, 0u);
  EXPECT_TRUE(rt.Accessible(b, kGranule, 0));
  // A second steal of granules freed after that wait waits again; one freed before it would not.
  provider->Unmap(b, kGranule);
  ASSERT_TRUE(provider->Map(a, kGranule).ok());
  EXPECT_EQ(rt.counters().device_synchronizations, 2u);
}

TEST(CudaStitchProvider, APoolInUseOrADeviceOutOfMemoryIsNamedAndTheCallTakesNothing) {
  FakeCudaRuntime rt;
  auto provider = Make(&rt, 2);
  absl::StatusOr<Segment> segment = provider->Reserve(8 * kGranule, kGranule);
  ASSERT_TRUE(segment.ok());
  const absl::Status status = provider->Map(segment->base, 3 * kGranule);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("cuda stitch provider (device 0)"));
  EXPECT_THAT(status.message(), HasSubstr("all 2 granules of the pool are in use"));
  // The two granules it mapped are reusable: another range gets them.
  ASSERT_TRUE(provider->Map(segment->base + 4 * kGranule, 2 * kGranule).ok());
  EXPECT_EQ(provider->counters().steals, 2u);

  FakeCudaRuntime small(FakeCudaOptions{1, 3 * kGranule});  // the device has less than the pool
  auto greedy = Make(&small, 4);
  absl::StatusOr<Segment> range = greedy->Reserve(8 * kGranule, kGranule);
  ASSERT_TRUE(range.ok());
  const absl::Status full = greedy->Map(range->base, 4 * kGranule);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));
}

TEST(CudaStitchProvider, ReleaseUnmapsThenReleasesHandlesThenFreesTheAddressSpace) {
  FakeCudaRuntime rt;
  {
    auto provider = Make(&rt, 3);
    absl::StatusOr<Segment> segment = provider->Reserve(6 * kGranule, kGranule);
    ASSERT_TRUE(segment.ok());
    ASSERT_TRUE(provider->Map(segment->base, 3 * kGranule).ok());
    provider->Unmap(segment->base + kGranule, kGranule);
    EXPECT_EQ(rt.live_handles(), 3u);
  }
  EXPECT_EQ(rt.live_handles(), 0u);
  EXPECT_EQ(rt.live_mappings(), 0u);
  EXPECT_EQ(rt.live_reservations(), 0u);
  EXPECT_EQ(rt.device_bytes_in_use(0), 0u);
  const std::vector<Kind> kinds = KindsOf(rt.vmm_log());
  const std::vector<Kind> tail(kinds.end() - 7, kinds.end());
  EXPECT_EQ(tail, (std::vector<Kind>{Kind::kUnmap, Kind::kUnmap, Kind::kUnmap, Kind::kFreeAddress, Kind::kRelease,
                                     Kind::kRelease, Kind::kRelease}));
  EXPECT_GE(rt.counters().device_synchronizations, 1u);  // the device finished with the memory first
}

TEST(CudaStitchProvider, RefusesDevicesWithoutVirtualMemoryAndGranulesOffTheirGranularity) {
  FakeCudaOptions no_vmm;
  no_vmm.virtual_memory = false;
  FakeCudaRuntime plain(no_vmm);
  absl::StatusOr<std::unique_ptr<CudaStitchProvider>> made = MakeCudaStitchProvider(&plain, 0, 8 * kGranule, kGranule);
  EXPECT_TRUE(absl::IsFailedPrecondition(made.status())) << made.status();
  EXPECT_THAT(made.status().message(), HasSubstr("does not support virtual memory management"));
  FakeCudaRuntime rt;
  made = MakeCudaStitchProvider(&rt, 0, 8 * kGranule, kGranule / 2);
  EXPECT_TRUE(absl::IsInvalidArgument(made.status()));
  EXPECT_THAT(made.status().message(), HasSubstr("granularity (2097152 bytes)"));
  made = MakeCudaStitchProvider(&rt, 0, kGranule / 2, kGranule);
  EXPECT_THAT(made.status().message(), HasSubstr("does not hold one granule"));
}

}  // namespace
}  // namespace remat::cuda
