// The C entry points (c_api.h) over the test double: they serve from the installed remat allocator, which the
// test installs with a FakeCudaRuntime behind it (c_api.cc is compiled into this test; the .so has the same code).
// remat_install_cuda_allocator is checked only on paths that fail before touching the CUDA runtime (the real one,
// on a machine without a GPU, is checked by tests/python/test_cuda.py).
#include "integration/cuda/c_api.h"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda/fake_cuda_runtime.h"
#include "integration/cuda/cuda_allocator.h"
#include "integration/engine_session.h"

namespace remat::integration {
namespace {

using ::testing::HasSubstr;
namespace cca = c10::cuda::CUDACachingAllocator;

class CudaCApi : public ::testing::Test {
 protected:
  explicit CudaCApi(int devices = 1) : rt_(cuda::FakeCudaOptions{devices}) {}
  void SetUp() override {
    native_ = cca::allocator.load();
    CudaAllocatorOptions options;
    options.budget = 4096;
    CudaStreams streams;
    streams.current = [](c10::DeviceIndex) { return cudaStream_t{nullptr}; };
    streams.handle = [](const c10::cuda::CUDAStream&) { return cudaStream_t{nullptr}; };
    allocator_ = std::make_unique<RematCudaAllocator>(&rt_, options, std::move(streams));
    ASSERT_TRUE(InstallCudaAllocator(allocator_.get()).ok());
  }
  void TearDown() override {
    ASSERT_TRUE(UninstallCudaAllocator().ok());
    EXPECT_EQ(cca::allocator.load(), native_);
  }
  std::int64_t Allocated() { return allocator_->getDeviceStats(0).allocated_bytes[0].current; }

  cuda::FakeCudaRuntime rt_;
  std::unique_ptr<RematCudaAllocator> allocator_;
  cca::CUDAAllocator* native_ = nullptr;
};

TEST_F(CudaCApi, PluggableEntryPointsServeFromTheInstalledAllocator) {
  remat_init(1);
  EXPECT_TRUE(allocator_->initialized());
  cudaStream_t side = *rt_.StreamCreate();
  void* p = remat_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Allocated(), 1024);
  std::size_t size = 0;
  EXPECT_NE(remat_base_alloc(p, &size), nullptr);
  EXPECT_EQ(size, 4096u);
  remat_record_stream(p, side);
  remat_free(p, 1000, 0, nullptr);
  EXPECT_EQ(Allocated(), 0);
  EXPECT_EQ(allocator_->getDeviceStats(0).active_bytes[0].current, 1024);  // pending on side's event
  remat_reset();  // empty_cache: waits for it and gives the segment back
  EXPECT_EQ(allocator_->getDeviceStats(0).reserved_bytes[0].current, 0);
  remat_set_memory_fraction(0.5, 0);
  EXPECT_DOUBLE_EQ(allocator_->getMemoryFraction(0), 0.5);
  EXPECT_EQ(remat_malloc(0, 0, nullptr), nullptr);
}

TEST_F(CudaCApi, MallocBeyondTheBudgetThrowsOutOfMemoryError) {
  void* p = remat_malloc(4096, 0, nullptr);
  try {
    remat_malloc(512, 0, nullptr);
    FAIL() << "expected OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("tried to allocate 512 bytes"));
  }
  remat_free(p, 4096, 0, nullptr);
}

TEST_F(CudaCApi, InstallReportsErrorsAsTextAndStatusCodes) {
  char error[512] = {};
  EXPECT_EQ(remat_install_cuda_allocator("lots", nullptr, nullptr, error, sizeof(error)), 3);  // InvalidArgument
  EXPECT_THAT(error, HasSubstr("malformed byte size \"lots\""));
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", "many", nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("\"many\""));
  // One is installed already (this fixture's): a second install says so.
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", nullptr, nullptr, error, sizeof(error)), 6);  // AlreadyExists
  EXPECT_THAT(error, HasSubstr("already installed"));
  ::unsetenv("REMAT_BUDGET");
  EXPECT_EQ(remat_install_cuda_allocator(nullptr, nullptr, nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("set REMAT_BUDGET"));
  ::setenv("REMAT_BUDGET", "6 bananas", 1);
  EXPECT_EQ(remat_install_cuda_allocator(nullptr, nullptr, nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("REMAT_BUDGET=\"6 bananas\" is not valid"));
  ::unsetenv("REMAT_BUDGET");
  // The arena: an unknown kind or a granule that is no power of two is named, from the argument or REMAT_ARENA.
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", nullptr, "stiched", error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("unknown arena 'stiched'; expected contiguous, stitch or stitch:SIZE"));
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", nullptr, "stitch:3MiB", error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("arena 'stitch:3MiB': the granule must be a power of two"));
  ::setenv("REMAT_ARENA", "paged", 1);
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", nullptr, nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("unknown REMAT_ARENA 'paged'"));
  ::unsetenv("REMAT_ARENA");
  // A truncated message is still terminated.
  char tiny[8];
  EXPECT_NE(remat_install_cuda_allocator("lots", nullptr, nullptr, tiny, sizeof(tiny)), 0);
  EXPECT_EQ(std::string(tiny).size(), 7u);
  EXPECT_STREQ(remat_cuda_torch_version(), "2.14");
}

// The runtime's side of eviction: a handler set through the C entry frees what it evicts with remat_free.
class FreeLast final : public PressureHandler {
 public:
  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t bytes) override {
    ++calls;
    requests.push_back(bytes);
    if (victims.empty()) return false;
    remat_free(victims.back(), 0, 0, nullptr);
    victims.pop_back();
    return true;
  }
  std::vector<void*> victims;
  std::vector<std::size_t> requests;
  int calls = 0;
};

TEST_F(CudaCApi, PressureHandlerSetThroughTheCEntryEvicts) {
  char error[256] = {};
  FreeLast handler;
  handler.victims.push_back(remat_malloc(2048, 0, nullptr));
  void* kept = remat_malloc(2048, 0, nullptr);
  ASSERT_EQ(remat_cuda_set_pressure_handler(0, &handler, error, sizeof(error)), 0) << error;
  void* victim = handler.victims.back();
  void* fresh = remat_malloc(1024, 0, nullptr);
  EXPECT_EQ(fresh, victim);
  EXPECT_EQ(handler.calls, 1);
  EXPECT_EQ(handler.requests, std::vector<std::size_t>{1024});
  EXPECT_EQ(Allocated(), 2048 + 1024);
  // Nothing left to evict: the handler gives up and the request fails with torch's OutOfMemoryError.
  EXPECT_THROW(remat_malloc(2048, 0, nullptr), c10::OutOfMemoryError);
  EXPECT_EQ(handler.calls, 2);
  EXPECT_EQ(remat_cuda_set_pressure_handler(0, nullptr, error, sizeof(error)), 0);
  EXPECT_THROW(remat_malloc(2048, 0, nullptr), c10::OutOfMemoryError);
  EXPECT_EQ(handler.calls, 2);  // removed
  EXPECT_NE(remat_cuda_set_pressure_handler(7, &handler, error, sizeof(error)), 0);
  EXPECT_THAT(error, HasSubstr("invalid CUDA device 7"));
  remat_free(fresh, 1024, 0, nullptr);
  remat_free(kept, 2048, 0, nullptr);
}

// The engine switched on through the C entry: over the installed allocator's device 0, its session and stats are
// the engine's (EnableRematEngineOn), the device's budget is its budget, and bad arguments are errors that say so.
// (Evicting CUDA tensors needs kernels on a device; tests/cuda/cuda_engine_test runs that logic on host memory.)
TEST_F(CudaCApi, EnableEngineRunsTheEngineSessionOnTheInstalledAllocatorsDevice) {
  char error[512] = {};
  EXPECT_EQ(remat_cuda_enable_engine(0, "belady", nullptr, nullptr, nullptr, error, sizeof(error)), 3);  // InvalidArgument
  EXPECT_THAT(error, HasSubstr("belady"));
  EXPECT_FALSE(RematEngineEnabled());
  EXPECT_EQ(remat_cuda_enable_engine(0, "lru", "cheap", nullptr, nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("unknown costs 'cheap'"));
  EXPECT_EQ(remat_cuda_enable_engine(0, "lru", nullptr, "sideways", nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("offload"));
  ASSERT_EQ(remat_cuda_enable_engine(0, "lru", "estimated", "auto", "64MiB", error, sizeof(error)), 0) << error;
  EXPECT_TRUE(RematEngineEnabled());
  EXPECT_EQ(remat_cuda_enable_engine(0, nullptr, nullptr, nullptr, nullptr, error, sizeof(error)), 6);  // AlreadyExists
  FreeLast handler;  // the engine is the pressure handler while it runs
  EXPECT_EQ(remat_cuda_set_pressure_handler(0, &handler, error, sizeof(error)), 9);
  EXPECT_THAT(error, HasSubstr("the remat engine is the CUDA pressure handler while it runs"));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->engine.evictions, 0);
  EXPECT_NE(allocator_->Device(0).arena(), nullptr);  // the budget is reserved from the start
  ASSERT_EQ(remat_cuda_disable_engine(error, sizeof(error)), 0) << error;
  EXPECT_FALSE(RematEngineEnabled());
  EXPECT_EQ(remat_cuda_disable_engine(error, sizeof(error)), 9);  // not enabled
  // The device's pressure handler was detached: a request beyond the budget fails at once.
  EXPECT_THROW(remat_malloc(8192, 0, nullptr), c10::OutOfMemoryError);
  // A handler the program set is not silently replaced by the engine.
  ASSERT_EQ(remat_cuda_set_pressure_handler(0, &handler, error, sizeof(error)), 0) << error;
  EXPECT_EQ(remat_cuda_enable_engine(0, "lru", nullptr, nullptr, nullptr, error, sizeof(error)), 9);
  EXPECT_THAT(error, HasSubstr("remove it (nullptr) before switching the engine on"));
  EXPECT_FALSE(RematEngineEnabled());
  ASSERT_EQ(remat_cuda_set_pressure_handler(0, nullptr, error, sizeof(error)), 0) << error;
}

class CudaCApiTwoDevices : public CudaCApi {
 protected:
  CudaCApiTwoDevices() : CudaCApi(2) {}
};

// Issue 19, "Every device": one engine per device, each over its device's arena and budget. -1 is the calling
// thread's current device (DDP: the rank's, once the process selected it); a device enabled twice, or one that is
// not valid, is an error naming it; disabling switches every device's engine off.
TEST_F(CudaCApiTwoDevices, EnableEngineAddsAnEnginePerDeviceAndMinusOneIsTheCurrentDevice) {
  char error[512] = {};
  ASSERT_TRUE(rt_.SetDevice(1).ok());
  ASSERT_EQ(remat_cuda_enable_engine(-1, "lru", nullptr, nullptr, nullptr, error, sizeof(error)), 0) << error;
  EXPECT_EQ(RematEngineDevices(), std::vector<int>{1});
  EXPECT_EQ(*rt_.GetDevice(), 1);
  EXPECT_EQ(remat_cuda_enable_engine(1, "lru", nullptr, nullptr, nullptr, error, sizeof(error)), 6);  // AlreadyExists
  EXPECT_THAT(error, HasSubstr("already runs on CUDA device 1"));
  EXPECT_EQ(remat_cuda_enable_engine(2, "lru", nullptr, nullptr, nullptr, error, sizeof(error)), 3);  // InvalidArgument
  EXPECT_THAT(error, HasSubstr("invalid CUDA device 2 (2 device(s))"));
  EXPECT_EQ(remat_cuda_enable_engine(-2, "lru", nullptr, nullptr, nullptr, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("CUDA device -2 is not valid"));
  EXPECT_EQ(remat_cuda_enable_engine(0, "belady", nullptr, nullptr, nullptr, error, sizeof(error)), 3);
  EXPECT_EQ(RematEngineDevices(), std::vector<int>{1});  // a failed enable adds nothing
  ASSERT_EQ(remat_cuda_enable_engine(0, "dtr-eq", nullptr, nullptr, nullptr, error, sizeof(error)), 0) << error;
  EXPECT_EQ(RematEngineDevices(), (std::vector<int>{0, 1}));
  EXPECT_NE(allocator_->Device(0).arena(), nullptr);  // each budget reserved from the start
  EXPECT_NE(allocator_->Device(1).arena(), nullptr);
  FreeLast handler;
  EXPECT_EQ(remat_cuda_set_pressure_handler(0, &handler, error, sizeof(error)), 9);
  ASSERT_TRUE(GetEngineStats(0).ok());
  ASSERT_TRUE(GetEngineStats(1).ok());
  ASSERT_EQ(remat_cuda_disable_engine(error, sizeof(error)), 0) << error;
  EXPECT_FALSE(RematEngineEnabled());
  EXPECT_EQ(remat_cuda_disable_engine(error, sizeof(error)), 9);
  // Both pressure handlers were detached.
  EXPECT_THROW(remat_malloc(8192, 0, nullptr), c10::OutOfMemoryError);
  EXPECT_THROW(remat_malloc(8192, 1, nullptr), c10::OutOfMemoryError);
  ASSERT_TRUE(rt_.SetDevice(0).ok());
}

TEST(CudaCApiWithoutAllocator, EnableEngineNeedsAnInstalledAllocator) {
  char error[256] = {};
  EXPECT_EQ(remat_cuda_enable_engine(0, nullptr, nullptr, nullptr, nullptr, error, sizeof(error)), 9);  // FailedPrecondition
  EXPECT_THAT(error, HasSubstr("install_cuda_allocator"));
}

TEST(CudaCApiWithoutAllocator, SetPressureHandlerNeedsAnInstalledAllocator) {
  char error[256] = {};
  EXPECT_EQ(remat_cuda_set_pressure_handler(0, nullptr, error, sizeof(error)), 9);  // FailedPrecondition
  EXPECT_THAT(error, HasSubstr("no remat CUDA allocator is installed"));
}

}  // namespace
}  // namespace remat::integration
