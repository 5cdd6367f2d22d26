// The storages an op reads: see op_capture.h (ForEachStorageRead, ArgumentStorages).
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

absl::InlinedVector<c10::StorageImpl*, 4> ArgumentStorages(const torch::jit::Stack& stack,
                                                           std::size_t num_arguments) {
  absl::InlinedVector<c10::StorageImpl*, 4> storages;
  auto add = [&](const at::Tensor& tensor) {
    if (!tensor.defined() || tensor.key_set().has(c10::DispatchKey::Python)) return;
    ForEachStorageRead(tensor, [&](c10::StorageImpl* impl) {
      if (std::find(storages.begin(), storages.end(), impl) == storages.end()) storages.push_back(impl);
    });
  };
  for (std::size_t i = stack.size() - num_arguments; i < stack.size(); ++i) ForEachTensor(stack[i], add);
  return storages;
}

}  // namespace remat::integration
