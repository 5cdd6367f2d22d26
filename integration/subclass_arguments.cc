#include "integration/subclass_arguments.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <string>

#include "integration/dispatch_hook.h"
#include "integration/op_capture.h"
#include "integration/traced_calls.h"

namespace remat::integration {
namespace {

std::atomic<SubclassArgumentCallback> g_callback{nullptr};
// The storages the callbacks of the call being asked about named as read (AskAboutSubclassArguments), or nullptr.
thread_local std::vector<c10::intrusive_ptr<c10::StorageImpl>>* t_reads = nullptr;

// A Python subclass tensor that may hold real memory: not a FakeTensor or another meta-backed tracer. Symbolic
// sizes do not say it is traced: a jagged nested tensor's ragged dimension is a nested int in eager mode too (the
// callback skips inner tensors that are not real).
bool RealSubclass(const at::Tensor& tensor) {
  return tensor.defined() && tensor.key_set().has(c10::DispatchKey::Python) && !tensor.is_meta();
}

void Tell(SubclassArgumentCallback callback, const at::Tensor& tensor, bool written) {
  if (!RealSubclass(tensor)) return;
  void* py_tensor = tensor.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  if (py_tensor == nullptr) return;  // never seen by Python: no subclass object to ask
  std::array<char, 1024> message{};
  const int result = callback(py_tensor, written ? 1 : 0, message.data(), message.size() - 1);
  if (result == 0) return;
  const std::string text = message.data();
  TORCH_CHECK_WITH(OutOfMemoryError, result != 2, text);
  TORCH_CHECK(false, text);
}

}  // namespace

void SetSubclassArgumentCallback(SubclassArgumentCallback callback) {
  g_callback.store(callback, std::memory_order_release);
}

std::vector<c10::intrusive_ptr<c10::StorageImpl>> AskAboutSubclassArguments(const c10::OperatorHandle& op,
                                                                            const OpTraits& traits,
                                                                            c10::DispatchKeySet below,
                                                                            const torch::jit::Stack& stack) {
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> reads;
  const SubclassArgumentCallback callback = g_callback.load(std::memory_order_acquire);
  if (callback == nullptr || !below.has(c10::DispatchKey::Python)) return reads;
  // functorch's transforms and functionalization wrap their own tensors: those calls are traced, not run.
  if (Tracing(below - c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}))) {
    return reads;
  }
  std::vector<c10::intrusive_ptr<c10::StorageImpl>>* const outer = t_reads;  // a callback's own ops may ask too
  t_reads = &reads;
  try {
    const std::size_t num_arguments = op.schema().arguments().size();
    const std::size_t first = stack.size() - num_arguments;
    for (std::size_t i = 0; i < num_arguments; ++i) {
      const bool written = std::find(traits.written_arguments.begin(), traits.written_arguments.end(),
                                     static_cast<int>(i)) != traits.written_arguments.end();
      const c10::IValue& value = stack[first + i];
      if (value.isTensor()) {
        Tell(callback, value.toTensor(), written);
      } else if (value.isTensorList()) {
        for (const at::Tensor& tensor : value.toTensorList()) Tell(callback, tensor, written);
      } else if (value.isOptionalTensorList()) {
        for (const std::optional<at::Tensor>& tensor : value.toOptionalTensorList()) {
          if (tensor.has_value()) Tell(callback, *tensor, written);
        }
      }
    }
  } catch (...) {
    t_reads = outer;
    throw;
  }
  t_reads = outer;
  return reads;
}

void NoteInnerReads(const std::vector<at::Tensor>& tensors) {
  if (t_reads == nullptr) return;
  for (const at::Tensor& tensor : tensors) {
    if (!IsPlain(tensor)) continue;
    c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
    const bool known = std::any_of(t_reads->begin(), t_reads->end(), [&](const auto& s) { return s.get() == impl; });
    if (!known) t_reads->push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  }
}

}  // namespace remat::integration
