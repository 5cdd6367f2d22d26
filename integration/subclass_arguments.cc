#include "integration/subclass_arguments.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "integration/dispatch_hook.h"
#include "integration/memory_events.h"
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

// The op's arguments that are subclass tensors, as PyObjects (borrowed: the stack holds their tensors), and whether
// the op writes each.
struct SubclassArguments {
  absl::InlinedVector<void*, 4> objects;
  absl::InlinedVector<int, 4> written;

  void Add(const at::Tensor& tensor, bool writes) {
    if (!RealSubclass(tensor)) return;
    void* object = tensor.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
    if (object == nullptr) return;  // never seen by Python: no subclass object to ask
    objects.push_back(object);
    written.push_back(writes ? 1 : 0);
  }
};

SubclassArguments FindSubclassArguments(const c10::OperatorHandle& op, const OpTraits& traits,
                                        const torch::jit::Stack& stack) {
  SubclassArguments found;
  const std::size_t num_arguments = op.schema().arguments().size();
  const std::size_t first = stack.size() - num_arguments;
  for (std::size_t i = 0; i < num_arguments; ++i) {
    const bool written = std::find(traits.written_arguments.begin(), traits.written_arguments.end(),
                                   static_cast<int>(i)) != traits.written_arguments.end();
    ForEachTensor(stack[first + i], [&](const at::Tensor& tensor) { found.Add(tensor, written); });
  }
  return found;
}

// Calls the callback with the op's subclass arguments, if any; returns the inner storages it named as read.
std::vector<c10::intrusive_ptr<c10::StorageImpl>> AskAboutSubclassArguments(const c10::OperatorHandle& op,
                                                                            const OpTraits& traits,
                                                                            c10::DispatchKeySet below,
                                                                            const torch::jit::Stack& stack) {
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> reads;
  const SubclassArgumentCallback callback = g_callback.load(std::memory_order_acquire);
  if (callback == nullptr) return reads;
  // functorch's transforms and functionalization wrap their own tensors: those calls are traced, not run.
  if (Tracing(below - c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}))) {
    return reads;
  }
  const SubclassArguments arguments = FindSubclassArguments(op, traits, stack);
  if (arguments.objects.empty()) return reads;
  std::array<char, 1024> message{};
  std::vector<c10::intrusive_ptr<c10::StorageImpl>>* const outer = t_reads;  // a callback's own ops may ask too
  t_reads = &reads;
  const int result = callback(arguments.objects.data(), arguments.written.data(), arguments.objects.size(),
                              message.data(), message.size() - 1);
  t_reads = outer;
  const std::string text = message.data();
  TORCH_CHECK_WITH(OutOfMemoryError, result != 2, text);
  TORCH_CHECK(result == 0, text);
  return reads;
}

}  // namespace

void SetSubclassArgumentCallback(SubclassArgumentCallback callback) {
  g_callback.store(callback, std::memory_order_release);
}

void RunSubclassOp(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below,
                   torch::jit::Stack* stack) {
  const std::vector<c10::intrusive_ptr<c10::StorageImpl>> reads = AskAboutSubclassArguments(op, traits, below, *stack);
  ObserverCall call;
  OpObserver* observer = reads.empty() ? nullptr : GetObserver();
  if (observer == nullptr) {
    PassThrough(op, below, stack);
    return;
  }
  absl::InlinedVector<c10::StorageImpl*, 4> read_raw;
  for (const auto& storage : reads) read_raw.push_back(storage.get());
  CompositeHold hold;
  {
    const MemoryEventScope history(traits.name, /*op=*/true);
    observer->BeginComposite(read_raw, {}, hold);
  }
  try {
    PassThrough(op, below, stack);
  } catch (...) {
    observer->EndComposite(hold);
    throw;
  }
  observer->EndComposite(hold);
}

bool RealInnerTensor(const at::Tensor& tensor) {
  return tensor.defined() && IsPlain(tensor) && !tensor.is_meta() && !Tracing(tensor.key_set());
}

void NoteInnerReads(const std::vector<at::Tensor>& tensors) {
  if (t_reads == nullptr) return;
  for (const at::Tensor& tensor : tensors) {
    if (!RealInnerTensor(tensor)) continue;
    c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
    const bool known = std::any_of(t_reads->begin(), t_reads->end(), [&](const auto& s) { return s.get() == impl; });
    if (!known) t_reads->push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  }
}

}  // namespace remat::integration
