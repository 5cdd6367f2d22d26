// CUDA's default generators for remat's random-op watch (integration/device_generator.h).
//
// A CUDA random kernel takes its generator's Philox seed and current offset and advances the offset
// (CUDAGeneratorImpl::philox_cuda_state). CudaGeneratorPosition reads the offset through
// philox_offset_per_thread(), which makes no CUDA call (the generic current_seed()/get_offset() each ask the
// runtime whether the current stream is capturing: a call per op). The seed is not read for the same reason: an op
// that draws moves the offset, and reseeding resets it to 0. libremat_cuda registers it for CUDA when it loads.
#pragma once

#include <ATen/core/Generator.h>

#include <optional>

#include "integration/device_generator.h"

namespace remat::integration {

// `generator` must be a CUDA generator; called with its mutex held.
std::optional<GeneratorPosition> CudaGeneratorPosition(const at::Generator& generator);

}  // namespace remat::integration
