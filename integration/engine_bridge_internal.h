// EngineBridge's internals shared by its implementation files (engine_bridge.cc: the ops; engine_bridge_storages.cc:
// the storage entries and their lifecycle). Nothing else includes it.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "integration/engine_bridge.h"

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

// `t` reaches every byte of its storage, once.
inline bool CoversStorage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         static_cast<std::size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

template <typename Visit>
void ForEachTensor(const c10::IValue& value, Visit&& visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) visit(t);
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toList()) ForEachTensor(e, visit);
  }
}

inline RngFingerprint DefaultCpuRngFingerprint() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  auto* cpu = generator.get<at::CPUGeneratorImpl>();
  const at::mt19937_data_pod& data = cpu->engine().data();
  return RngFingerprint{data.seed_, data.left_, data.next_, data.state_.front(), data.state_.back(),
                        cpu->next_float_normal_sample(), cpu->next_double_normal_sample()};
}

inline std::uintptr_t AddressOf(c10::StorageImpl& impl) {
  return reinterpret_cast<std::uintptr_t>(impl._mutable_data_ptr_no_checks().get());
}

// Dying constants up to this size that records read are kept (at most 1/64 of the budget in all).
inline constexpr std::int64_t kKeptConstantMaxBytes = 4096;

}  // namespace remat::integration::bridge_internal
