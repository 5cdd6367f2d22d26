// Which random generator an op draws from, on any device, and where that generator stands.
//
// A random op without a Generator argument (dropout, SDPA with dropout, a compiled graph's seeds) draws from the
// default generator of the device it runs on: the CPU's Mersenne Twister for CPU ops; CUDA's Philox seed and offset
// for CUDA ops (each kernel takes the current offset and advances it); an out-of-tree backend's generator through
// its PrivateUse1 hooks. The hook copies that generator before the op and lends the copy's state to the default
// generator for a replay (dispatch_hook.cc), so a replayed dropout draws the same mask on every device.
//
// OpDevice: the device whose generator an op draws from: the first non-CPU device among its tensor arguments
//   (tensor lists included) and Device arguments, else the CPU. InvalidArgument naming both when the arguments
//   are on two different non-CPU devices (no single generator to capture).
// DefaultGeneratorOf: at::globalContext().defaultGenerator(device), i.e. torch's own; FailedPrecondition naming
//   the device when torch has none for it (no such device, no GPU, a backend without generator hooks).
// GeneratorPosition: where a non-CPU generator stands, so that an op not known to be random can be caught drawing
//   from it (OpInFlight::WatchGenerator; the CPU generator has its own fingerprint, op_in_flight.h). A reader may be
//   registered per device type: libremat_cuda registers CUDA's (integration/cuda/cuda_generator.h), which reads the
//   Philox offset without a CUDA call. Otherwise the generator's own current_seed() and get_offset(); nullopt when
//   it tells neither (then such ops are not watched on that device: said in the README).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace remat::integration {

absl::StatusOr<c10::Device> OpDevice(const torch::jit::Stack& arguments);

absl::StatusOr<at::Generator> DefaultGeneratorOf(c10::Device device);

struct GeneratorPosition {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  bool operator==(const GeneratorPosition&) const = default;
};

// Reads `generator`'s position; called with the generator's mutex held.
using GeneratorPositionReader = std::optional<GeneratorPosition> (*)(const at::Generator& generator);
// Replaces the reader for `device_type` (nullptr: back to the generic one). Thread safe.
void RegisterGeneratorPositionReader(c10::DeviceType device_type, GeneratorPositionReader reader);

// The position of `device`'s default generator now (under its lock); nullopt for the CPU, for a device torch has no
// generator for, and for a generator that tells no position.
std::optional<GeneratorPosition> DefaultGeneratorPosition(c10::Device device);

}  // namespace remat::integration
