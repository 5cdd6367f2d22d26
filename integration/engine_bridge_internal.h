// EngineBridge's internals shared by its implementation files (engine_bridge.cc: the ops; engine_bridge_storages.cc:
// the storage entries and their lifecycle; op_in_flight.cc: the op between BeforeOp and AfterOp) and by the router
// that drives several bridges (device_router.cc). Nothing else includes it.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "integration/engine_bridge.h"
#include "integration/op_capture.h"

namespace remat::integration::bridge_internal {

// An engine error as the PyTorch exception a user expects: torch.OutOfMemoryError for a lack of memory, else a
// RuntimeError, naming remat once.
[[noreturn]] inline void Throw(const absl::Status& status) {
  // Most messages already name remat; do not say it twice.
  const std::string message(status.message());
  const char* prefix = absl::StartsWith(message, "remat: ") ? "" : "remat: ";
  if (absl::IsResourceExhausted(status)) TORCH_CHECK_WITH(OutOfMemoryError, false, prefix, message);
  TORCH_CHECK(false, prefix, message);
  __builtin_unreachable();
}

using ::remat::integration::ForEachTensor;  // op_capture.h

inline std::uintptr_t AddressOf(c10::StorageImpl& impl) {
  return reinterpret_cast<std::uintptr_t>(impl._mutable_data_ptr_no_checks().get());
}

}  // namespace remat::integration::bridge_internal
