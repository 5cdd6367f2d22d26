// The test double itself: stream order, holds, events, waits and copy checking, since every other CUDA test
// leans on it behaving like the runtime.
#include "tests/cuda/fake_cuda_runtime.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace remat::cuda {
namespace {

TEST(CudaFakeRuntime, WorkRunsInStreamOrderAndHoldsQueueIt) {
  FakeCudaRuntime rt;
  cudaStream_t s = *rt.StreamCreate();
  std::vector<int> order;
  rt.Launch(s, [&] { order.push_back(1); });
  EXPECT_EQ(order, std::vector<int>{1});
  rt.HoldStream(s);
  rt.Launch(s, [&] { order.push_back(2); });
  rt.Launch(s, [&] { order.push_back(3); });
  EXPECT_EQ(order.size(), 1u);
  EXPECT_EQ(rt.PendingWork(s), 2u);
  EXPECT_FALSE(*rt.StreamQuery(s));
  rt.ReleaseStream(s);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(*rt.StreamQuery(s));
}

TEST(CudaFakeRuntime, EventsCompleteWhenTheirStreamReachesThem) {
  FakeCudaRuntime rt;
  cudaStream_t s = *rt.StreamCreate();
  cudaEvent_t e = *rt.EventCreate();
  EXPECT_TRUE(*rt.EventQuery(e));  // never recorded
  rt.HoldStream(s);
  ASSERT_TRUE(rt.EventRecord(e, s).ok());
  EXPECT_FALSE(*rt.EventQuery(e));
  ASSERT_TRUE(rt.EventSynchronize(e).ok());  // the host waits: the held work runs
  EXPECT_TRUE(*rt.EventQuery(e));
  EXPECT_EQ(rt.counters().synchronizations, 1u);
  ASSERT_TRUE(rt.EventDestroy(e).ok());
  EXPECT_FALSE(rt.EventQuery(e).ok());
}

TEST(CudaFakeRuntime, StreamWaitEventBlocksOnlyThatStream) {
  FakeCudaRuntime rt;
  cudaStream_t a = *rt.StreamCreate();
  cudaStream_t b = *rt.StreamCreate();
  cudaEvent_t e = *rt.EventCreate();
  rt.HoldStream(a);
  ASSERT_TRUE(rt.EventRecord(e, a).ok());
  ASSERT_TRUE(rt.StreamWaitEvent(b, e).ok());
  int ran_b = 0;
  int ran_default = 0;
  rt.Launch(b, [&] { ++ran_b; });
  rt.Launch(nullptr, [&] { ++ran_default; });
  EXPECT_EQ(ran_b, 0);
  EXPECT_EQ(ran_default, 1);
  rt.ReleaseStream(a);
  EXPECT_EQ(ran_b, 1);
}

TEST(CudaFakeRuntime, CopiesAreCheckedAgainstAllocations) {
  FakeCudaRuntime rt;
  auto* dev = static_cast<char*>(*rt.DeviceMalloc(1024));
  auto* host = static_cast<char*>(*rt.HostAllocPinned(1024));
  std::memset(host, 7, 1024);
  ASSERT_TRUE(rt.MemcpyAsync(dev, host, 1024, CopyKind::kHostToDevice, nullptr).ok());
  EXPECT_EQ(dev[1023], 7);
  EXPECT_FALSE(rt.MemcpyAsync(dev, host, 2048, CopyKind::kHostToDevice, nullptr).ok());  // overruns
  EXPECT_FALSE(rt.MemcpyAsync(host, dev, 16, CopyKind::kHostToDevice, nullptr).ok());    // kinds swapped
  EXPECT_FALSE(rt.DeviceFree(host).ok());
  ASSERT_TRUE(rt.DeviceFree(dev).ok());
  ASSERT_TRUE(rt.HostFreePinned(host).ok());
  EXPECT_EQ(rt.live_device_allocations(), 0u);
}

TEST(CudaFakeRuntime, DeviceMemoryIsBounded) {
  FakeCudaRuntime rt(FakeCudaOptions{2, 4096});
  EXPECT_EQ(rt.DeviceMalloc(8192).status().code(), absl::StatusCode::kResourceExhausted);
  void* p = *rt.DeviceMalloc(4096);
  EXPECT_EQ(rt.MemGetInfo()->free, 0u);
  ASSERT_TRUE(rt.SetDevice(1).ok());
  EXPECT_EQ(rt.MemGetInfo()->free, 4096u);
  EXPECT_FALSE(rt.SetDevice(2).ok());
  ASSERT_TRUE(rt.SetDevice(0).ok());
  rt.FailNextDeviceMalloc();
  ASSERT_TRUE(rt.DeviceFree(p).ok());
  EXPECT_FALSE(rt.DeviceMalloc(16).ok());
  EXPECT_TRUE(rt.DeviceMalloc(16).ok());
}

// The ordering model: a kernel that reads what a copy on another stream writes races with it unless its stream
// waits for an event recorded after the copy, or the host learned the copy finished.
TEST(FakeCudaRuntime, KernelsRaceWithCopiesTheyAreNotOrderedAfter) {
  FakeCudaRuntime rt;
  cudaStream_t copy = *rt.StreamCreate();
  cudaStream_t compute = *rt.StreamCreate();
  void* device = *rt.DeviceMalloc(4096);
  void* host = *rt.HostAllocPinned(4096);
  const FakeRange block{reinterpret_cast<std::uintptr_t>(device), 4096};
  rt.HoldStream(copy);
  ASSERT_TRUE(rt.MemcpyAsync(device, host, 4096, CopyKind::kHostToDevice, copy).ok());
  rt.LaunchKernel(compute, {block}, {}, "reader");
  EXPECT_EQ(rt.counters().races, 1u);
  ASSERT_EQ(rt.races().size(), 1u);
  EXPECT_NE(rt.races()[0].find("reader reads 4096 bytes"), std::string::npos) << rt.races()[0];

  cudaEvent_t copied = *rt.EventCreate();
  cudaEvent_t read = *rt.EventCreate();
  ASSERT_TRUE(rt.EventRecord(read, compute).ok());  // overwriting what a kernel reads: after that kernel
  ASSERT_TRUE(rt.StreamWaitEvent(copy, read).ok());
  ASSERT_TRUE(rt.MemcpyAsync(device, host, 4096, CopyKind::kHostToDevice, copy).ok());
  ASSERT_TRUE(rt.EventRecord(copied, copy).ok());
  ASSERT_TRUE(rt.StreamWaitEvent(compute, copied).ok());
  rt.LaunchKernel(compute, {block}, {}, "ordered reader");
  EXPECT_EQ(rt.counters().races, 1u);  // no new race
  // A copy out of the block must come after the kernel that writes it.
  rt.LaunchKernel(compute, {}, {block}, "writer");
  ASSERT_TRUE(rt.MemcpyAsync(host, device, 4096, CopyKind::kDeviceToHost, copy).ok());
  EXPECT_EQ(rt.counters().races, 2u);
  EXPECT_EQ(rt.host_waits_for(compute), 0u);
  rt.ReleaseStream(copy);
  ASSERT_TRUE(rt.StreamSynchronize(compute).ok());
  EXPECT_EQ(rt.host_waits_for(compute), 1u);
  EXPECT_EQ(rt.host_waits_for(copy), 0u);
  ASSERT_TRUE(rt.EventSynchronize(copied).ok());
  EXPECT_EQ(rt.host_waits_for(copy), 1u);
  // The host knows everything finished: what it launches now is ordered after all of it.
  ASSERT_TRUE(rt.MemcpyAsync(device, host, 4096, CopyKind::kHostToDevice, copy).ok());
  ASSERT_TRUE(rt.StreamSynchronize(copy).ok());
  rt.LaunchKernel(compute, {}, {block}, "after the host waited");
  EXPECT_EQ(rt.counters().races, 2u);
  ASSERT_TRUE(rt.EventDestroy(copied).ok());
  ASSERT_TRUE(rt.EventDestroy(read).ok());
  ASSERT_TRUE(rt.DeviceFree(device).ok());
  ASSERT_TRUE(rt.HostFreePinned(host).ok());
}

}  // namespace
}  // namespace remat::cuda
