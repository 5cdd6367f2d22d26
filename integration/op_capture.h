// What the dispatch hook captures of an op, shared with the code that records ops whose body runs outside a kernel
// (opaque_call.cc). Implemented in dispatch_hook.cc, next to the hook's own capture (the traits in op_traits.cc); not an
// API for other layers.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "integration/dispatch_hook.h"

namespace remat::integration {

// The traits of `op`'s schema, computed at its first use and shared by every thread (op_traits.cc).
const OpTraits* SharedTraits(const c10::OperatorHandle& op);
// Guards SharedTraits' table (the hook holds it across fork()).
std::mutex& TraitsMutex();

// A strided tensor over a storage whose bytes its sizes and strides describe: what remat records, evicts and restores.
// A nested tensor says its layout is strided but is a buffer of several components (no sizes of its own): not one.
inline bool StridedOverStorage(const at::Tensor& tensor) {
  return tensor.layout() == c10::kStrided && tensor.has_storage() && !tensor.is_nested();
}
// Calls visit(tensor) for every tensor in an op's argument or return: a tensor, a tensor list, a list of optional
// tensors (undefined ones included: callers check).
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

// A dense CPU/CUDA-style tensor: StridedOverStorage, and no Python subclass behind it.
bool IsPlain(const at::Tensor& tensor);
// Calls visit for each storage whose bytes an op on `tensor` reads: its own, or, for a sparse tensor (which has no
// storage), those of its indices and values: dense tensors, often the outputs of recorded ops, which an op's kernel
// reads as a sparse tensor's parts.
void ForEachStorageRead(const at::Tensor& tensor, absl::FunctionRef<void(c10::StorageImpl*)> visit);
// The storages the tensors among a composite op's arguments (the last num_arguments values of `stack`: tensors,
// tensor lists, optional tensor lists) read, each once (ForEachStorageRead; not those of Python subclasses, which
// trace), in two kinds:
//   - read_raw: what its kernel may read through a raw pointer between the ops it calls. A composite kernel is
//     device-generic, so the bytes it reads itself are those that describe the work on the host: lengths, sizes,
//     offsets, masks (aten::lstm.data's batch_sizes, ctc_loss's lengths): integer and boolean tensors, and every
//     part of a sparse tensor;
//   - passed_on: floating-point and complex tensors, whose values it only hands to the ops it calls (which bring
//     them back themselves) or whose metadata it reads (expand_as, view_as, reshape_as: sizes, never bytes).
// A storage seen under both kinds (a dtype view) is read_raw.
struct CompositeArgumentStorages {
  absl::InlinedVector<c10::StorageImpl*, 4> read_raw;
  absl::InlinedVector<c10::StorageImpl*, 4> passed_on;
  bool python_arguments = false;  // a tensor argument of a Python subclass: its storages are not listed
  bool empty() const { return read_raw.empty() && passed_on.empty(); }
};
CompositeArgumentStorages CompositeArguments(const torch::jit::Stack& stack, std::size_t num_arguments);

// A copy of `value` in which every plain tensor is a detached alias over the same storage; notes tensor storages in
// `storages` when set; clears `replayable` for a tensor that is not plain (sparse, a Python subclass). With
// `storages` set (a record's capture) the aliases have no version counter (they are only read, never run on: replays
// alias them again with one, ReplayArguments).
c10::IValue AliasValue(const c10::IValue& value, InputStorages* storages,
                       bool* replayable);
// Fills record.outputs from the op's returns, the top of `stack`.
void CaptureOutputs(OpRecord& record, const c10::Stack& stack);
// A private copy of the generator's state, taken under its lock.
at::Generator CopyGenerator(const at::Generator& generator);
// A private copy of the default generator of the device the op with these arguments runs on (device_generator.h:
// the CPU's, CUDA's Philox state, a backend's); nullopt when there is none to copy (arguments on two devices, a
// device torch has no generator for).
std::optional<at::Generator> CopyDefaultGenerator(const c10::Stack& arguments);

// Counts a call into the observer in flight, so that SetObserver(nullptr) + WaitForObserverCalls() can tell when the
// old observer may be destroyed. Construct it before reading the observer (the count is sequentially consistent: a
// thread that reads a non-null observer was counted before SetObserver(nullptr) returned).
class ObserverCall {
 public:
  ObserverCall();
  ~ObserverCall();
  ObserverCall(const ObserverCall&) = delete;
  ObserverCall& operator=(const ObserverCall&) = delete;
};

// Runs the op below the hook without recording it. A kernel that reads an evicted storage throws remat's
// evicted-access error, with the op's name added as context.
void PassThrough(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack);

// While inside a recorded op on this thread, every op passes through unrecorded (its nested calls are part of it).
void EnterRecordedOp();
void LeaveRecordedOp();
bool InsideRecordedOp();

}  // namespace remat::integration
