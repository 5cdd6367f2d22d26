#include "integration/out_of_memory.h"

#include <c10/util/Exception.h>

#include "absl/strings/match.h"

namespace remat::integration {
namespace {

// The openings of the allocators' messages (cpu_allocator.cc, allocator/cuda/device_arena.cc).
constexpr const char* kOutOfMemoryMessages[] = {"remat: CPU memory budget exhausted",
                                                "remat: CUDA memory budget exhausted"};

}  // namespace

std::string MessageOf(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) return torch_error->what_without_backtrace();
  return error.what();
}

bool IsOutOfMemory(const std::exception& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) return true;
  const std::string message = MessageOf(error);
  for (const char* opening : kOutOfMemoryMessages) {
    if (absl::StrContains(message, opening)) return true;
  }
  return false;
}

void RedispatchTypingOutOfMemory(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  try {
    op.redispatchBoxed(keys, stack);
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::exception& error) {
    if (!IsOutOfMemory(error)) throw;
    TORCH_CHECK_WITH(OutOfMemoryError, false, MessageOf(error));
  }
}

}  // namespace remat::integration
