// CUDA generator positions: see cuda_generator.h for the contract.
#include "integration/cuda/cuda_generator.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>

namespace remat::integration {

std::optional<GeneratorPosition> CudaGeneratorPosition(const at::Generator& generator) {
  if (generator.device().type() != c10::DeviceType::CUDA) return std::nullopt;
  const auto* cuda = static_cast<const at::CUDAGeneratorImpl*>(generator.unsafeGetGeneratorImpl());
  return GeneratorPosition{0, cuda->philox_offset_per_thread()};
}

namespace {

// Registered when libremat_cuda.so loads (this file is compiled into it).
[[maybe_unused]] const bool registered = [] {
  RegisterGeneratorPositionReader(c10::DeviceType::CUDA, &CudaGeneratorPosition);
  return true;
}();

}  // namespace
}  // namespace remat::integration
