#include "integration/traced_calls.h"

#include <c10/core/DispatchKey.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

namespace remat::integration {
namespace {

bool TracedTensor(const at::Tensor& tensor) {
  return tensor.defined() && (tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || tensor.is_meta() ||
                              tensor.key_set().has(c10::DispatchKey::Python));
}

bool SymbolicOrMeta(const c10::IValue& value) {
  return value.isSymInt() || value.isSymFloat() || (value.isDevice() && value.toDevice().is_meta());
}

}  // namespace

bool Tracing(c10::DispatchKeySet below) {
  static const c10::DispatchKeySet kTracing = c10::DispatchKeySet({
      c10::DispatchKey::Python, c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchDynamicLayerBackMode,
      c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchVmapMode, c10::DispatchKey::FuncTorchGradWrapper,
      c10::DispatchKey::BatchedNestedTensor, c10::DispatchKey::Batched, c10::DispatchKey::VmapMode});
  return !(below & kTracing).empty() || below.has_backend(c10::BackendComponent::MetaBit);
}

ArgumentKind KindOfArguments(const torch::jit::Stack& stack, std::size_t num_arguments) {
  bool has_tensor = false;
  for (std::size_t i = stack.size() - num_arguments; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor()) {
      if (TracedTensor(value.toTensor())) return ArgumentKind::kTraced;
      has_tensor = true;
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList()) {
        if (TracedTensor(tensor)) return ArgumentKind::kTraced;
        has_tensor = true;
      }
    }
  }
  if (has_tensor) return ArgumentKind::kRealTensors;
  for (std::size_t i = stack.size() - num_arguments; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (SymbolicOrMeta(value)) return ArgumentKind::kTraced;
    if (value.isList()) {  // concrete int lists are IntLists; a SymInt[] with a symbol is a generic list
      for (const c10::IValue& element : value.toListRef()) {
        if (SymbolicOrMeta(element)) return ArgumentKind::kTraced;
      }
    }
  }
  return ArgumentKind::kNoTensors;
}

bool OnRealTensorsUnderPythonMode(c10::DispatchKeySet below, const torch::jit::Stack& stack,
                                  std::size_t num_arguments) {
  if (!below.has(c10::DispatchKey::Python) || c10::impl::TorchDispatchModeTLS::stack_len() == 0) return false;
  if (Tracing(below - c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}))) {
    return false;
  }
  return KindOfArguments(stack, num_arguments) == ArgumentKind::kRealTensors;
}

}  // namespace remat::integration
