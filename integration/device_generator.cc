// Device generators: see device_generator.h for the contract.
#include "integration/device_generator.h"

#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace remat::integration {
namespace {

std::array<std::atomic<GeneratorPositionReader>, static_cast<std::size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
    g_readers{};

// Keeps the first non-CPU device seen in `*device`; false on a second, different one (reported by the caller).
bool Note(c10::Device seen, std::optional<c10::Device>* device, c10::Device* other) {
  if (seen.is_cpu()) return true;
  if (!device->has_value()) {
    *device = seen;
    return true;
  }
  if (**device == seen) return true;
  *other = seen;
  return false;
}

std::optional<GeneratorPosition> GenericPosition(const at::Generator& generator) {
  try {
    return GeneratorPosition{generator.current_seed(), generator.get_offset()};
  } catch (const c10::Error&) {
    return std::nullopt;  // a generator without offsets (get_offset is optional for backends)
  }
}

}  // namespace

absl::StatusOr<c10::Device> OpDevice(const torch::jit::Stack& arguments) {
  std::optional<c10::Device> device;
  c10::Device other(c10::DeviceType::CPU);
  bool single = true;
  for (const c10::IValue& value : arguments) {
    if (value.isTensor()) {
      const at::Tensor& tensor = value.toTensor();
      if (tensor.defined()) single = Note(tensor.device(), &device, &other) && single;
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList()) {
        if (tensor.defined()) single = Note(tensor.device(), &device, &other) && single;
      }
    } else if (value.isDevice()) {
      single = Note(value.toDevice(), &device, &other) && single;
    }
  }
  if (!single) {
    return absl::InvalidArgumentError(absl::StrCat("remat: the op's arguments are on ", device->str(), " and ",
                                                   other.str(), ": no single generator to capture"));
  }
  return device.value_or(c10::Device(c10::DeviceType::CPU));
}

absl::StatusOr<at::Generator> DefaultGeneratorOf(c10::Device device) {
  try {
    return at::globalContext().defaultGenerator(device);
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(absl::StrCat("remat: torch has no default generator for ", device.str(),
                                                      ": ", e.what_without_backtrace()));
  }
}

void RegisterGeneratorPositionReader(c10::DeviceType device_type, GeneratorPositionReader reader) {
  g_readers[static_cast<std::size_t>(device_type)].store(reader, std::memory_order_release);
}

std::optional<GeneratorPosition> DefaultGeneratorPosition(c10::Device device) {
  if (device.is_cpu()) return std::nullopt;
  absl::StatusOr<at::Generator> generator = DefaultGeneratorOf(device);
  if (!generator.ok()) return std::nullopt;
  const GeneratorPositionReader reader =
      g_readers[static_cast<std::size_t>(device.type())].load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(generator->mutex());
  return reader != nullptr ? reader(*generator) : GenericPosition(*generator);
}

}  // namespace remat::integration
