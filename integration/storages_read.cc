// The storages an op reads: see op_capture.h (ForEachStorageRead, CompositeArguments).
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>

#include <algorithm>

#include "integration/op_capture.h"

namespace remat::integration {

void ForEachStorageRead(const at::Tensor& tensor, absl::FunctionRef<void(c10::StorageImpl*)> visit) {
  if (!tensor.defined()) return;
  if (tensor.has_storage()) {
    visit(tensor.storage().unsafeGetStorageImpl());
    return;
  }
  auto part = [&](const at::Tensor& t) {
    if (t.defined() && t.has_storage()) visit(t.storage().unsafeGetStorageImpl());
  };
  switch (tensor.layout()) {
    case c10::kSparse: {
      const auto* impl = static_cast<const at::SparseTensorImpl*>(tensor.unsafeGetTensorImpl());
      part(impl->indices());
      part(impl->values());
      break;
    }
    case c10::kSparseCsr:
    case c10::kSparseCsc:
    case c10::kSparseBsr:
    case c10::kSparseBsc: {
      const auto* impl = static_cast<const at::SparseCsrTensorImpl*>(tensor.unsafeGetTensorImpl());
      part(impl->compressed_indices());
      part(impl->plain_indices());
      part(impl->values());
      break;
    }
    default:
      break;
  }
}

CompositeArgumentStorages CompositeArguments(const torch::jit::Stack& stack, std::size_t num_arguments) {
  CompositeArgumentStorages storages;
  auto contains = [](const auto& list, c10::StorageImpl* impl) {
    return std::find(list.begin(), list.end(), impl) != list.end();
  };
  auto add = [&](const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    if (tensor.key_set().has(c10::DispatchKey::Python)) {
      storages.python_arguments = true;
      return;
    }
    const bool values_only = tensor.layout() == c10::kStrided &&
                             (c10::isFloatingType(tensor.scalar_type()) || c10::isComplexType(tensor.scalar_type()));
    ForEachStorageRead(tensor, [&](c10::StorageImpl* impl) {
      if (contains(storages.read_raw, impl)) return;
      if (values_only) {
        if (!contains(storages.passed_on, impl)) storages.passed_on.push_back(impl);
        return;
      }
      storages.passed_on.erase(std::remove(storages.passed_on.begin(), storages.passed_on.end(), impl),
                               storages.passed_on.end());
      storages.read_raw.push_back(impl);
    });
  };
  for (std::size_t i = stack.size() - num_arguments; i < stack.size(); ++i) ForEachTensor(stack[i], add);
  return storages;
}

}  // namespace remat::integration
