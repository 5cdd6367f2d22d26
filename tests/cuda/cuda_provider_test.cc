// The cuda and pinned-host providers over the test double: alignment, errors, release, device switching.
#include "allocator/cuda/cuda_provider.h"

#include <gtest/gtest.h>

#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::cuda {
namespace {

TEST(CudaProvider, DeviceSegmentsAreAlignedAndReleased) {
  FakeCudaRuntime rt;
  auto provider = MakeCudaDeviceProvider(&rt, 0);
  EXPECT_EQ(provider->Name(), "cuda");
  EXPECT_TRUE(provider->BacksMemory());
  absl::StatusOr<Segment> seg = provider->Reserve(1 << 20, 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(seg->base % 4096, 0u);
  EXPECT_EQ(seg->size, 1u << 20);
  EXPECT_EQ(rt.live_device_allocations(), 1u);
  provider->Release(*seg);
  EXPECT_EQ(rt.live_device_allocations(), 0u);
}

TEST(CudaProvider, OutOfMemoryNamesProviderAndSize) {
  FakeCudaRuntime rt(FakeCudaOptions{1, 1 << 20});
  auto provider = MakeCudaDeviceProvider(&rt, 0);
  absl::StatusOr<Segment> seg = provider->Reserve(2 << 20, 512);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(seg.status().message().find("cuda provider: cannot reserve 2097152 bytes"), std::string_view::npos)
      << seg.status();
}

TEST(CudaProvider, AllocatesOnItsDeviceAndRestoresTheCurrentOne) {
  FakeCudaRuntime rt(FakeCudaOptions{2, 1 << 20});
  auto provider = MakeCudaDeviceProvider(&rt, 1);
  Segment seg = *provider->Reserve(4096, 256);  // cudaMalloc's own alignment: no over-allocation
  EXPECT_EQ(rt.device_bytes_in_use(1), 4096u);
  EXPECT_EQ(rt.device_bytes_in_use(0), 0u);
  EXPECT_EQ(*rt.GetDevice(), 0);
  provider->Release(seg);
}

TEST(CudaProvider, PinnedHostSegmentsComeFromHostAlloc) {
  FakeCudaRuntime rt;
  auto provider = MakePinnedHostProvider(&rt);
  EXPECT_EQ(provider->Name(), "pinned host");
  Segment seg = *provider->Reserve(8192, 512);
  EXPECT_EQ(rt.live_host_allocations(), 1u);
  EXPECT_EQ(rt.live_device_allocations(), 0u);
  provider->Release(seg);
  EXPECT_EQ(rt.live_host_allocations(), 0u);
}

}  // namespace
}  // namespace remat::cuda
