// CUDA's default generators as remat watches them (integration/cuda/cuda_generator.h). torch 2.14 makes no CUDA
// generator without a driver (even from a state: it asks the runtime for the device count), so only the refusal of
// another device's generator runs here; reading a CUDA generator's Philox offset is exercised by
// tests/gpu/test_cuda_random.py, never run by us.
#include "integration/cuda/cuda_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace remat::integration {
namespace {

TEST(CudaGenerator, AnotherDevicesGeneratorHasNoPhiloxPosition) {
  EXPECT_FALSE(CudaGeneratorPosition(at::detail::getDefaultCPUGenerator()).has_value());
}

}  // namespace
}  // namespace remat::integration
