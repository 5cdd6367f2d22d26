// The engine on a CUDA device's arena (CudaDeviceMemory over RematCudaAllocator, EnableRematEngineOn), run against
// the CUDA-runtime test double. The double's "device memory" is host memory, so the test makes CPU tensors over it:
// a c10 CPU allocator that allocates from the CUDA allocator (FakeDeviceAllocator) is installed for the test, and
// real CPU kernels run on the device arena's blocks. What runs is the CUDA path's own code: the device arena
// (budget, streams, pending stream-ordered frees), its pressure handler calling the engine, CudaDeviceMemory's
// allocations, slides and copies through the CudaRuntime seam, and the engine session without a CPU arena.
#include "integration/cuda/cuda_device_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tanh.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator/cuda/fake_cuda_runtime.h"
#include "integration/engine_session.h"
#include "tests/integration/arena_layout_workload.h"
#include "tests/integration/chain_workload.h"

namespace remat::integration {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kKiB = 1024;

// c10's CPU allocator for the test: every CPU tensor's memory is a block of the CUDA allocator's device 0 arena,
// allocated on the stream the test calls current.
class FakeDeviceAllocator final : public c10::Allocator {
 public:
  FakeDeviceAllocator(RematCudaAllocator* cuda, const cudaStream_t* current) : cuda_(cuda), current_(current) {}
  c10::DataPtr allocate(std::size_t bytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (bytes == 0) return c10::DataPtr(nullptr, nullptr, cuda_->raw_deleter(), cpu);
    void* pointer = cuda_->Malloc(bytes, 0, *current_);
    return c10::DataPtr(pointer, pointer, cuda_->raw_deleter(), cpu);
  }
  c10::DeleterFnPtr raw_deleter() const override { return cuda_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  RematCudaAllocator* cuda_;
  const cudaStream_t* current_;
};

// A CUDA allocator over the double with a budget, installed (for CPU tensors) as c10's CPU allocator while it lives.
struct FakeDevice {
  explicit FakeDevice(std::size_t budget) {
    CudaAllocatorOptions options;
    options.budget = budget;
    CudaStreams streams;
    streams.current = [this](c10::DeviceIndex) { return current; };
    streams.handle = [](const c10::cuda::CUDAStream&) -> cudaStream_t { return nullptr; };
    cuda = std::make_unique<RematCudaAllocator>(&rt, options, std::move(streams));
    host = std::make_unique<FakeDeviceAllocator>(cuda.get(), &current);
    previous = c10::GetCPUAllocator();
    c10::SetCPUAllocator(host.get(), kPriority);
  }
  ~FakeDevice() {
    if (RematEngineEnabled()) (void)DisableRematEngine();  // a failed assertion left it on
    c10::SetCPUAllocator(previous, kPriority);
  }

  absl::Status Enable(const std::string& policy, OffloadMode offload = OffloadMode::kOff) {
    absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
        CudaDeviceMemory::Create(cuda.get(), 0, host.get(), c10::DeviceType::CPU);
    if (!memory.ok()) return memory.status();
    EngineSessionOptions options;
    options.budget = budget();
    options.policy = policy;
    options.costs = "estimated";
    options.offload = offload;
    options.bandwidth_bytes_per_s = kCudaLinkBandwidthBytesPerS;
    options.latency_ns = kCudaLinkLatencyNs;
    return EnableRematEngineOn(options, *std::move(memory));
  }
  std::size_t budget() { return *cuda->Device(0).Budget(); }
  cuda::DeviceArenaStats Stats() { return cuda->Device(0).Stats(); }

  static constexpr std::uint8_t kPriority = 200;  // above whatever the process installed
  cuda::FakeCudaRuntime rt{cuda::FakeCudaOptions{1, std::size_t{64} << 20}};
  cudaStream_t current = nullptr;
  std::unique_ptr<RematCudaAllocator> cuda;
  std::unique_ptr<FakeDeviceAllocator> host;
  c10::Allocator* previous = nullptr;
};

std::vector<at::Tensor> Reference(int seed, int n) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB
  at::manual_seed(seed);
  return Chain(x, n);
}

class CudaEngine : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaEngine, ChainUnderATightDeviceBudgetIsBitwiseIdentical) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(7, 24);  // made before the fake device: plain host memory
  FakeDevice device(704 * kKiB);  // 24 x 64 KiB stay alive: three times the budget
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});  // on the device: a constant for remat
  ASSERT_TRUE(device.Enable(GetParam()).ok());
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 24);
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(at::equal(ys[i], reference[i])) << i;
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.evictions, 0);
  EXPECT_GT(stats->engine.rematerializations, 0);
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  EXPECT_GT(device.Stats().pressure_allocations, 0);
  // Disabling brings every live tensor back into the device's memory, under its budget: keep what fits.
  std::vector<at::Tensor> kept;
  for (std::size_t i = 0; i < ys.size(); i += 6) kept.push_back(ys[i]);
  ys.clear();
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
  for (std::size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(at::equal(kept[i], reference[6 * i])) << i;
}

// Relocation on the device (DeviceArena::TryAllocate and a copy through the runtime): under ten 64 KiB blocks,
// five constants (written behind the hook's back) alternate with five activations, which are then dropped; a
// 128 KiB result needs a constant moved out of the way, with its bytes.
TEST(CudaEngineMemory, ConstantsMoveOutOfTheWayWithTheirBytes) {
  const at::Tensor small = at::randn({128, 128});  // made before the fake device: outside its arena
  const at::Tensor big = at::randn({256, 128});
  const at::Tensor expected = at::sin(big);
  FakeDevice device(640 * kKiB);
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  const ConstantsBetweenHoles layout = ConstantsBetweenHoles::Make(small);
  const at::Tensor y = at::sin(big);
  EXPECT_TRUE(at::equal(y, expected));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->engine.relocations, 1);
  EXPECT_EQ(layout.ExpectBytesKept(), stats->engine.relocations);
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  // The bytes moved through cudaMemcpyAsync.
  EXPECT_GE(device.rt.counters().copies, static_cast<std::uint64_t>(stats->engine.relocations));
}

// A slide on the device (DeviceArena::Move: the block list and the bytes, copied on the block's stream): x sits
// between two 64 KiB holes of a 192 KiB budget and cat(x, x) needs 128 KiB while its kernel reads x, so the kernel
// runs out of memory; the hook runs it again once the engine has slid x down onto the first hole.
TEST(CudaEngineMemory, AKernelWhoseInputSplitsTheFreeBytesRunsAgainAfterASlide) {
  const at::Tensor small = at::randn({128, 128});  // outside the device's arena
  const at::Tensor expected = at::cat({at::sin(small), at::sin(small)});
  FakeDevice device(192 * kKiB);
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  const InputBetweenHoles layout = InputBetweenHoles::Make(small);
  const at::Tensor& x = layout.x;
  const std::uintptr_t base = layout.base;
  ASSERT_LT(device.Stats().largest_free_block, 128 * kKiB);
  const at::Tensor y = at::cat({x, x});
  EXPECT_TRUE(at::equal(y, expected));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->retried_ops, 1);
  EXPECT_GE(stats->engine.compactions, 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x.const_data_ptr()), base);  // slid down onto the first hole
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
}

TEST(CudaEngineDisable, HoldingMoreThanTheBudgetWhenDisablingIsAnErrorThatSaysSo) {
  at::manual_seed(11);
  FakeDevice device(512 * kKiB);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 12);  // 768 KiB alive
  const absl::Status disabled = DisableRematEngine();
  EXPECT_EQ(disabled.code(), absl::StatusCode::kResourceExhausted) << disabled;
  EXPECT_THAT(std::string(disabled.message()), HasSubstr("CUDA memory budget exhausted"));
  EXPECT_FALSE(RematEngineEnabled());
}

INSTANTIATE_TEST_SUITE_P(Policies, CudaEngine, ::testing::Values("dtr-eq", "coop", "lru"));

TEST(CudaEngineStreams, EvictionsOnTwoStreamsWaitForPendingUsesAndStayIdentical) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(5, 18);
  FakeDevice device(512 * kKiB);
  absl::StatusOr<cudaStream_t> first = device.rt.StreamCreate();
  absl::StatusOr<cudaStream_t> second = device.rt.StreamCreate();
  ASSERT_TRUE(first.ok() && second.ok());
  device.current = *first;
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  at::manual_seed(5);
  std::vector<at::Tensor> ys = Chain(x, 9);
  device.current = *second;  // torch switched streams: blocks freed from now on wait for their streams' events
  std::vector<at::Tensor> more = Chain(ys.back(), 9);
  ys.insert(ys.end(), more.begin(), more.end());
  more.clear();
  // Chain(ys.back(), 9) continues the random stream where Chain(x, 9) left it: the same 18 values.
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(at::equal(ys[i], reference[i])) << i;
  const cuda::DeviceArenaStats stats = device.Stats();
  EXPECT_TRUE(stats.multi_stream);
  EXPECT_GT(stats.synchronizations, 0);  // the engine's frees were pending until their events completed
  EXPECT_GT(GetEngineStats()->engine.evictions, 0);
  EXPECT_LE(stats.allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  ys.resize(4);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

TEST(CudaEngineErrors, TooSmallABudgetRaisesOutOfMemoryErrorSayingWhatHoldsTheMemory) {
  FakeDevice device(192 * kKiB);
  at::manual_seed(1);
  const at::Tensor x = at::randn({64, 64});  // 16 KiB of the 192
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  const at::Tensor doubled = at::mul(x, 2);  // the engine adopts x as a constant
  try {
    (void)at::empty({3 << 14});  // 192 KiB
    FAIL() << "no OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_THAT(message, HasSubstr("CUDA memory budget exhausted on device 0: tried to allocate 196608 bytes"));
    EXPECT_THAT(message, HasSubstr("locked by the running ops 0, constant 16384 of which 16384 in the arena"));
    EXPECT_THAT(message, HasSubstr("running 'aten::empty.memory_format'"));
  }
  // Still usable.
  EXPECT_TRUE(at::equal(at::div(doubled, 2), x));
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

// Paging on the device: victims are copied to the engine's host tier through the pinned staging block
// (cudaMemcpyAsync device-to-host and back, checked by the double against live device and pinned allocations) and
// come back byte-identical when read.
TEST(CudaEnginePaging, OffloadAlwaysPagesThroughPinnedStagingAndStaysIdentical) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(7, 24);
  FakeDevice device(704 * kKiB);
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kAlways).ok());
  const std::uint64_t pinned_before = device.rt.counters().host_allocs;
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 24);
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(at::equal(ys[i], reference[i])) << i;
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.page_outs, 0);
  EXPECT_GT(stats->engine.page_ins, 0);
  EXPECT_EQ(stats->executor.page_outs, stats->engine.page_outs);
  EXPECT_GT(device.rt.counters().host_allocs, pinned_before);  // the staging block
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  ys.resize(4);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
  EXPECT_EQ(device.rt.live_host_allocations(), 0u);  // the staging block went with the engine
}

TEST(CudaEngineErrors, TheInstalledAllocatorIsNeeded) {
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory = CudaDeviceMemory::ForInstalledAllocator(0);
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(memory.status().message()), HasSubstr("install_cuda_allocator"));
}

}  // namespace
}  // namespace remat::integration
