// The C entry points (c_api.h) over the test double: they serve from the installed remat allocator, which the
// test installs with a FakeCudaRuntime behind it (c_api.cc is compiled into this test; the .so has the same code).
// remat_install_cuda_allocator is checked only on paths that fail before touching the CUDA runtime.
#include "integration/cuda/c_api.h"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "allocator/cuda/fake_cuda_runtime.h"
#include "integration/cuda/cuda_allocator.h"

namespace remat::integration {
namespace {

using ::testing::HasSubstr;
namespace cca = c10::cuda::CUDACachingAllocator;

class CudaCApi : public ::testing::Test {
 protected:
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

TEST_F(CudaCApi, InstallReportsErrorsAsText) {
  char error[512] = {};
  EXPECT_EQ(remat_install_cuda_allocator("lots", nullptr, error, sizeof(error)), 1);
  EXPECT_THAT(error, HasSubstr("malformed byte size \"lots\""));
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", "many", error, sizeof(error)), 1);
  EXPECT_THAT(error, HasSubstr("\"many\""));
  // One is installed already (this fixture's): a second install says so.
  EXPECT_EQ(remat_install_cuda_allocator("1GiB", nullptr, error, sizeof(error)), 1);
  EXPECT_THAT(error, HasSubstr("already installed"));
  ::unsetenv("REMAT_BUDGET");
  EXPECT_EQ(remat_install_cuda_allocator(nullptr, nullptr, error, sizeof(error)), 1);
  EXPECT_THAT(error, HasSubstr("set REMAT_BUDGET"));
  // A truncated message is still terminated.
  char tiny[8];
  EXPECT_EQ(remat_install_cuda_allocator("lots", nullptr, tiny, sizeof(tiny)), 1);
  EXPECT_EQ(std::string(tiny).size(), 7u);
}

}  // namespace
}  // namespace remat::integration
