// Dispatch hook: see dispatch_hook.h for the contract. The ops' traits are op_traits.cc.
//
// Hot path (pass-through): a thread_local depth read and one acquire load of the observer, then redispatch below our key.
// Recording path: traits come from a thread_local cache keyed by the schema's address (one global lookup per
// operator per thread); capture fills one TensorImpl per tensor argument (a spare of a dropped record when the thread
// has one, else shallow_copy_and_detach; no dispatcher call) and, for random ops, one copy of the generator. The kernel
// runs with the key excluded: its nested calls never reach the fallback, except for an in-place op that autograd
// records, whose autograd kernel may save a copy of the input it overwrites (OpRecord::hidden_copies): its nested
// calls come through the fallback, which passes them on and keeps the copies (hidden_copies.h).
// (Over 600 lines: the fallback, capture and replay share this file's thread-local state; the op traits, the
// hidden copies and the storages an op reads (storages_read.cc) have files of their own.)
#include "integration/dispatch_hook.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "integration/composite_attempt.h"
#include "integration/device_generator.h"
#include "integration/hidden_copies.h"
#include "integration/memory_events.h"
#include "integration/op_capture.h"
#include "integration/op_effects.h"
#include "integration/out_of_memory.h"
#include "integration/storage_eviction.h"
#include "integration/subclass_arguments.h"
#include "integration/traced_calls.h"

// From ATen/autocast_mode.h, which includes ATen/ATen.h (too slow to compile here); same declarations.
namespace at::autocast {
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
TORCH_API void set_autocast_dtype(at::DeviceType device_type, at::ScalarType dtype);
}  // namespace at::autocast

namespace remat::integration {
namespace {

std::atomic<bool> g_installed{false};
c10::DispatchKey g_key = kHookKeyCandidates[0];  // written once, before g_installed is set
std::atomic<OpObserver*> g_observer{nullptr};
std::atomic<int> g_observer_calls{0};
thread_local int t_depth = 0;

// ---- Capture ----


// A detached alias of a plain tensor. Anything else (sparse, Python subclasses, functorch wrappers) is kept as
// it is, because detaching it would run user code, and the record is marked not replayable.
// `versioned`: the alias gets a version counter of its own, as any tensor an op runs on needs (an in-place kernel
// bumps it). A record's own aliases are only read (shapes, storages) and re-aliased for each replay
// (ReplayArguments), so they go without one: no counter to allocate and free per tensor argument of every op.
// Spare TensorImpls of the aliases of records that died (RecycleAliases), for the captures that follow on this
// thread: a fresh alias costs an allocation, a TensorImpl's construction and, when its record is dropped, its
// destruction (about 0.8k instructions per tensor argument, in inference mode to skip a version counter's allocation
// on top). Records die in bulk when the bridge prunes (every RecordStore::kPruneEvery ops), so the pool holds up to
// a prune's worth of two-tensor ops; each spare is a bare TensorImpl (no storage, about 200 bytes).
constexpr std::size_t kMaxSpareAliases = 4096;
thread_local std::vector<c10::intrusive_ptr<c10::TensorImpl>> t_spare_aliases;

// A spare can stand in for shallow_copy_and_detach of `source`: both plain TensorImpls (not a subclass, which
// detaches differently) and no Python dispatch mode to run (shallow_copy_and_detach would let it detach).
bool SpareFits(const std::vector<c10::intrusive_ptr<c10::TensorImpl>>& spares, const c10::TensorImpl& source) {
  return !spares.empty() && typeid(source) == typeid(c10::TensorImpl) &&
         c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

at::Tensor DetachedAlias(const at::Tensor& tensor, bool* replayable, bool versioned) {
  if (!tensor.defined()) return tensor;
  if (!IsPlain(tensor)) {
    *replayable = false;
    return tensor;
  }
  std::vector<c10::intrusive_ptr<c10::TensorImpl>>& spares = t_spare_aliases;  // one TLS lookup
  if (!versioned && SpareFits(spares, *tensor.unsafeGetTensorImpl())) {
    // The same copy of the metadata shallow_copy_and_detach makes (storage, sizes, strides, offset, dtype, device,
    // keys), into a spare whose version counter is already the disabled one.
    c10::intrusive_ptr<c10::TensorImpl> impl = std::move(spares.back());
    spares.pop_back();
    impl->shallow_copy_from(tensor.getIntrusivePtr());
    return at::Tensor(std::move(impl));
  }
  // Under a Python dispatch mode, shallow_copy_and_detach asks the mode to detach (its handler sees aten::detach
  // and may return anything): with the Python key excluded it copies the TensorImpl, as without a mode.
  std::optional<c10::impl::ExcludeDispatchKeyGuard> no_mode;
  if (c10::impl::TorchDispatchModeTLS::stack_len() != 0) [[unlikely]] no_mode.emplace(c10::DispatchKey::Python);
  if (versioned) {
    return at::Tensor(
        tensor.unsafeGetTensorImpl()->shallow_copy_and_detach(c10::VariableVersion(0),
                                                              /*allow_tensor_metadata_change=*/true));
  }
  // A TensorImpl made outside inference mode allocates a version counter that shallow_copy_and_detach then throws
  // away: made in inference mode it skips that allocation and its free. Nothing else differs: the alias takes the
  // source's dispatch keys (autograd's included).
  const c10::InferenceMode no_version_counter;
  return at::Tensor(tensor.unsafeGetTensorImpl()->shallow_copy_and_detach(
      c10::VariableVersion(c10::VariableVersion::DISABLED), /*allow_tensor_metadata_change=*/true));
}

void NoteStorage(const at::Tensor& tensor, InputStorages* storages) {
  if (storages == nullptr) return;
  ForEachStorageRead(tensor, [&](c10::StorageImpl* impl) {
    for (const auto& known : *storages) {
      if (known.get() == impl) return;
    }
    storages->push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  });
}

// Forward-mode AD: an op's autograd kernel also reads each dual argument's tangent, which is not among its
// arguments (the ops that compute the output's tangent run inside the kernel, unrecorded). Notes those storages as
// read too, so that they are resident while the kernel runs. A replay runs on the primal values and reads none of
// them; listed with the op's inputs, they are kept for it as any input is (a little more memory kept, never less).
void NoteTangents(const torch::jit::Stack& stack, std::size_t num_arguments, InputStorages* storages) {
  if (!torch::autograd::ForwardADLevel::has_any_level()) return;  // a few instructions: no walk over the arguments
  for (std::size_t i = stack.size() - num_arguments; i < stack.size(); ++i) {
    ForEachTensor(stack[i], [&](const at::Tensor& tensor) {
      if (!tensor.defined() || tensor.unsafeGetTensorImpl()->autograd_meta() == nullptr) return;
      const at::Tensor& tangent = tensor._fw_grad(/*level=*/0);  // Python allows one level at a time: index 0
      if (tangent.defined()) NoteStorage(tangent, storages);
    });
  }
}

}  // namespace

// A copy of `value` in which every tensor is a detached alias; notes tensor storages when `storages` is set.
c10::IValue AliasValue(const c10::IValue& value, InputStorages* storages,
                       bool* replayable) {
  // Capture (storages set) keeps the alias in the record; a replay (no storages) runs the op on it.
  const bool versioned = storages == nullptr;
  if (value.isTensor()) {
    NoteStorage(value.toTensor(), storages);
    return DetachedAlias(value.toTensor(), replayable, versioned);
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    const c10::List<at::Tensor> source = value.toTensorList();
    list.reserve(source.size());
    for (const at::Tensor& tensor : source) {
      NoteStorage(tensor, storages);
      list.push_back(DetachedAlias(tensor, replayable, versioned));
    }
    return list;
  }
  if (value.isList()) {  // e.g. Tensor?[] (indices of aten::index)
    const c10::List<c10::IValue> source = value.toList();
    c10::impl::GenericList list(source.elementType());
    list.reserve(source.size());
    for (const c10::IValue& element : source) list.push_back(AliasValue(element, storages, replayable));
    return list;
  }
  return value;
}

at::Generator CopyGenerator(const at::Generator& generator) {
  at::Generator shared = generator;
  std::lock_guard<std::mutex> lock(shared.mutex());
  return shared.clone();
}

std::optional<at::Generator> CopyDefaultGenerator(const c10::Stack& arguments) {
  const absl::StatusOr<c10::Device> device = OpDevice(arguments);
  if (!device.ok()) return std::nullopt;
  const absl::StatusOr<at::Generator> generator = DefaultGeneratorOf(*device);
  if (!generator.ok()) return std::nullopt;
  return CopyGenerator(*generator);
}

namespace {

void CaptureRng(OpRecord& record, const c10::Stack& arguments) {
  const int index = record.traits->generator_argument;
  if (index >= 0 && arguments[index].isGenerator()) {
    record.rng = CopyGenerator(arguments[index].toGenerator());
    return;
  }
  // The op draws from the default generator of its device (device_generator.h): CUDA's Philox seed and offset on a
  // GPU. Without one to copy, the op cannot be replayed: its outputs stay constants.
  record.rng = CopyDefaultGenerator(arguments);
  if (!record.rng.has_value()) record.replayable = false;
}

// Autocast is on for a device when its key is not excluded (torch excludes the autocast keys by default).
void CaptureAutocast(OpRecord& record) {
  if (!record.tls_keys.excluded_.has(c10::DispatchKey::AutocastCPU)) {
    record.autocast_cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
  }
  if (!record.tls_keys.excluded_.has(c10::DispatchKey::AutocastCUDA)) {
    record.autocast_cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
  }
}

// Sets the autocast dtype of a device for its lifetime.
class AutocastDtypeGuard {
 public:
  AutocastDtypeGuard(c10::DeviceType device, std::optional<c10::ScalarType> dtype)
      : device_(device), active_(dtype.has_value()) {
    if (!active_) return;
    saved_ = at::autocast::get_autocast_dtype(device);
    at::autocast::set_autocast_dtype(device, *dtype);
  }
  ~AutocastDtypeGuard() {
    if (active_) at::autocast::set_autocast_dtype(device_, saved_);
  }
  AutocastDtypeGuard(const AutocastDtypeGuard&) = delete;
  AutocastDtypeGuard& operator=(const AutocastDtypeGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_;
  c10::ScalarType saved_ = c10::ScalarType::Undefined;
};

// Calls visit(return_index, tensor) for every defined tensor among the op's returns, in order.
template <typename Visit>
void ForEachReturnedTensor(const c10::Stack& stack, std::size_t num_returns, Visit visit) {
  const std::size_t first = stack.size() - num_returns;
  for (std::size_t r = 0; r < num_returns; ++r) {
    const c10::IValue& value = stack[first + r];
    const int index = static_cast<int>(r);
    if (value.isTensor()) {
      if (value.toTensor().defined()) visit(index, value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList()) {
        if (tensor.defined()) visit(index, tensor);
      }
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toList()) {
        if (element.isTensor() && element.toTensor().defined()) visit(index, element.toTensor());
      }
    }
  }
}

void FillMeta(TensorMeta& meta, const at::Tensor& tensor) {
  meta.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
  meta.strides.assign(tensor.strides().begin(), tensor.strides().end());
  meta.storage_offset = tensor.storage_offset();
  meta.dtype = tensor.scalar_type();
  meta.device = tensor.device();
}

TensorMeta MetaOf(const at::Tensor& tensor) {
  TensorMeta meta;
  FillMeta(meta, tensor);
  return meta;
}

bool SameLayout(const TensorMeta& a, const TensorMeta& b) {
  return a.sizes == b.sizes && a.strides == b.strides && a.storage_offset == b.storage_offset &&
         a.dtype == b.dtype && a.device == b.device;
}

}  // namespace

void CaptureOutputs(OpRecord& record, const c10::Stack& stack) {
  ForEachReturnedTensor(stack, record.op.schema().returns().size(), [&](int r, const at::Tensor& tensor) {
    if (!StridedOverStorage(tensor)) return;
    CapturedOutput& output = record.outputs.emplace_back();  // filled in place: its shape vectors are not moved
    output.return_index = r;
    c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
    output.storage = tensor.storage().getWeakStorageImpl();
    output.storage_nbytes = impl->sym_nbytes().is_heap_allocated() ? 0 : impl->nbytes();
    FillMeta(output.meta, tensor);
    for (std::size_t i = 0; i < record.input_storages.size(); ++i) {
      if (record.input_storages[i].get() == impl) output.input_storage = static_cast<int>(i);
    }
  });
}

namespace {

struct DepthGuard {
  DepthGuard() { ++t_depth; }
  ~DepthGuard() { --t_depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

}  // namespace

// The innermost op the hook passed through is the one whose kernel read an evicted storage: name it.
void PassThrough(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  try {
    op.redispatchBoxed(below, stack);
  } catch (c10::Error& e) {
    const bool named = std::any_of(e.context().begin(), e.context().end(), [](const std::string& c) {
      return c.find(kUnrecordedReadContext) != std::string::npos;
    });
    if (!named && e.msg().find(kEvictedAccessMessage) != std::string::npos) {
      e.add_context(absl::StrCat(kUnrecordedReadContext, " ", TraitsOf(op).name, " (dispatch key ",
                                 c10::toString(below.highestPriorityTypeId()), ")"));
    }
    throw;
  }
}

bool IsPlain(const at::Tensor& tensor) {
  return StridedOverStorage(tensor) && !tensor.key_set().has(c10::DispatchKey::Python);
}

ObserverCall::ObserverCall() { g_observer_calls.fetch_add(1, std::memory_order_seq_cst); }
ObserverCall::~ObserverCall() { g_observer_calls.fetch_sub(1, std::memory_order_release); }

void EnterRecordedOp() { ++t_depth; }
void LeaveRecordedOp() { --t_depth; }
bool InsideRecordedOp() { return t_depth != 0; }

namespace {

// How an op is recorded: kPlain; kUnderPythonMode, an op on real tensors under a Python dispatch mode (see
// OnRealTensorsUnderPythonMode): the mode's handler is part of its kernel, it is not replayable (a mode may change
// what the op returns; the replay would run without it), and its outputs are dropped from the record when the mode
// returned something other than real tensors.
enum class Recording { kPlain, kUnderPythonMode };

void RecordOp(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below,
              torch::jit::Stack* stack, OpObserver* observer, Recording recording = Recording::kPlain);

// A call nested in a watched op (hidden_copies.h): passed on; a clone of an input the op writes is kept.
void WatchNestedCall(OpRecord& record, const c10::OperatorHandle& op, c10::DispatchKeySet below,
                     torch::jit::Stack* stack) {
  const int written = WrittenInputCloned(record, op, *stack);
  if (written < 0) {
    PassThrough(op, below, stack);
    return;
  }
  const at::Tensor self = (*stack)[stack->size() - 2].toTensor();
  PassThrough(op, below, stack);
  if (stack->back().isTensor()) KeepCopy(record, written, self, stack->back().toTensor());
}

// A composite op (DecomposesAt): its nested ops are recorded; the arguments its kernel may read through raw pointers
// are brought back, and its resident arguments stay resident and in place while it runs (dispatch_hook.h, "What the
// fallback does"). When one of its ops runs out of memory, its held arguments may be what splits the free memory: a
// composite that can run again (composite_attempt.h) does so, after the observer moved them out of the way.
void RunComposite(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below,
                  torch::jit::Stack* stack) {
  if (c10::autocast_dispatch_keyset.has(below.highestPriorityTypeId())) {  // casts and calls again: reads nothing
    PassThrough(op, below, stack);
    return;
  }
  const std::size_t num_arguments = op.schema().arguments().size();
  const CompositeArgumentStorages storages = CompositeArguments(*stack, num_arguments);
  ObserverCall call;
  OpObserver* observer = storages.empty() ? nullptr : g_observer.load(std::memory_order_seq_cst);
  if (observer == nullptr) {
    PassThrough(op, below, stack);
    return;
  }
  const bool repeatable =
      traits.written_arguments.empty() && !traits.random && traits.replayable && !storages.python_arguments;
  const std::size_t base = stack->size() - num_arguments;
  absl::InlinedVector<c10::IValue, 8> retry_arguments;
  if (repeatable) retry_arguments.assign(stack->begin() + base, stack->end());
  for (int retries = 0;; ++retries) {
    CompositeHold hold;
    {
      // What bringing the arguments back replays is the composite's doing, on remat.trace's timeline.
      const MemoryEventScope history(traits.name, /*op=*/true);
      observer->BeginComposite(storages.read_raw, storages.passed_on, hold);
    }
    CompositeAttempt attempt(storages, repeatable);
    try {
      PassThrough(op, below, stack);
    } catch (const std::exception& error) {
      observer->EndComposite(hold);
      // Out of memory in whatever type it arrives (a composite kernel written in Python raises torch's Python
      // error). An exception making the hole throws (a failed move) propagates instead of the out-of-memory error.
      if (!IsOutOfMemory(error) || !attempt.repeatable() || retries >= kMaxOutOfMemoryRetries ||
          !observer->RetryCompositeAfterOutOfMemory()) {
        throw;
      }
      stack->resize(base);
      stack->insert(stack->end(), retry_arguments.begin(), retry_arguments.end());
      continue;
    } catch (...) {
      observer->EndComposite(hold);
      throw;
    }
    observer->EndComposite(hold);
    return;
  }
}

void Fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, g_key);
  if (t_depth != 0 || g_observer.load(std::memory_order_relaxed) == nullptr) {  // the cheap pass-through test
    if (t_depth == 1) [[unlikely]] {  // only a watched op lets its nested calls reach the fallback
      if (OpRecord* watched = WatchedOp()) {
        WatchNestedCall(*watched, op, below, stack);
        return;
      }
    }
    PassThrough(op, below, stack);
    return;
  }
  const OpTraits& traits = TraitsOf(op);
  const bool under_python_mode = OnRealTensorsUnderPythonMode(below, *stack, op.schema().arguments().size());
  if (!traits.tracked) {  // remat's own ops: not counted
    PassThrough(op, below, stack);
    return;
  }
  if (!under_python_mode && (Tracing(below) || TracedArguments(*stack, op.schema().arguments().size()))) {
    // A subclass over real tensors runs the op on them where remat cannot see: subclass_arguments.h.
    if (below.has(c10::DispatchKey::Python)) [[unlikely]] {
      RunSubclassOp(op, traits, below, stack);
      return;
    }
    PassThrough(op, below, stack);
    return;
  }
  if (DecomposesAt(op, traits, below)) {
    RunComposite(op, traits, below, stack);
    return;
  }
  ObserverCall call;
  OpObserver* observer = g_observer.load(std::memory_order_seq_cst);
  if (observer == nullptr) {
    PassThrough(op, below, stack);
    return;
  }
  RecordOp(op, traits, below, stack, observer, under_python_mode ? Recording::kUnderPythonMode : Recording::kPlain);
}

void RecordOp(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below,
              torch::jit::Stack* stack, OpObserver* observer, Recording recording) {
  DepthGuard depth;
  const MemoryEventScope history(traits.name, /*op=*/true);  // the op's span on remat.trace's timeline
  OpRecord record(op, traits);
  record.replayable = traits.replayable && recording == Recording::kPlain;
  const std::size_t num_arguments = op.schema().arguments().size();
  record.arguments.reserve(num_arguments);
  for (std::size_t i = stack->size() - num_arguments; i < stack->size(); ++i) {
    record.arguments.push_back(AliasValue((*stack)[i], &record.input_storages, &record.replayable));
  }
  NoteTangents(*stack, num_arguments, &record.input_storages);
  if (traits.random) CaptureRng(record, record.arguments);
  record.unannotated_writes = UnannotatedWritesOfCall(op.schema().name(), record.arguments);
  if ((traits.writes_unreturned || !record.unannotated_writes.empty()) &&
      !OutputsIgnoreSideWrites(op.schema().name(), record.arguments)) {
    record.replayable = false;  // its outputs may depend on what it wrote (op_effects.h, 3 and 4)
  }
  CaptureAutocast(record);
  record.in_backward = torch::autograd::get_current_graph_task_id() != -1;
  CompositeAttempt::NoteRecordedOp(record, recording == Recording::kUnderPythonMode);
  observer->BeforeOp(record);
  // An op that writes none of its arguments, draws no random numbers and has no other side effect can run again
  // after running out of memory, with the same result: keep its arguments.
  const std::size_t base = stack->size() - num_arguments;
  const bool retryable = traits.written_arguments.empty() && record.unannotated_writes.empty() && !traits.random &&
                         traits.replayable;
  absl::InlinedVector<c10::IValue, 8> retry_arguments;  // no allocation for the usual few arguments
  if (retryable) retry_arguments.assign(stack->begin() + base, stack->end());
  const bool watch_copies = WatchesCopies(traits, *stack, base);
  auto start = std::chrono::steady_clock::now();
  for (int retries = 0;; ++retries) {
    try {
      // The kernel runs with the key excluded: its nested calls are part of the op (a replay runs them again), so
      // they go straight to their kernels instead of through this fallback (boxing their arguments costs about a
      // microsecond per op with nested calls, aten::mm's among them). What a thread started by the kernel inherits
      // follows: at::launch and a backward pass the kernel runs capture this state, so their ops are part of the
      // op too, as they were on this thread through t_depth; at::parallel_for's OpenMP workers never had the key.
      // (Threads a kernel starts are in dispatch_hook_test's KernelThreads tests.)
      // A watched op (WatchesCopies) is the exception: its nested calls come through the fallback (one more
      // boxed call each), and a thread its kernel starts does not inherit the exclusion.
      std::optional<c10::impl::ExcludeDispatchKeyGuard> nested_calls_pass;
      if (!watch_copies) nested_calls_pass.emplace(g_key);
      const CopyWatch watch(watch_copies ? &record : nullptr);
      RedispatchTypingOutOfMemory(op, below, stack);
      break;
    } catch (const c10::OutOfMemoryError&) {
      bool retry = false;
      try {
        retry = retryable && retries < kMaxOutOfMemoryRetries && observer->RetryAfterOutOfMemory(record);
      } catch (...) {  // making the hole failed otherwise than for room (a failed move): that error, not the OOM
        observer->OpFailed(record);
        throw;
      }
      if (!retry) {
        observer->OpFailed(record);
        throw;
      }
      stack->resize(base);
      stack->insert(stack->end(), retry_arguments.begin(), retry_arguments.end());
      start = std::chrono::steady_clock::now();  // the op's cost is that of the run that succeeds
    } catch (c10::Error& e) {
      // Its nested calls did not go through the hook, so nothing named the op that read an evicted storage: a
      // recorded op's inputs are resident (BeforeOp), so this is remat's bug; name the op for the report.
      if (e.msg().find(kEvictedAccessMessage) != std::string::npos) {
        e.add_context(absl::StrCat("remat: the evicted storage was read inside the recorded op ", traits.name));
      }
      observer->OpFailed(record);
      throw;
    } catch (...) {
      observer->OpFailed(record);
      throw;
    }
  }
  retry_arguments.clear();
  record.duration_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  if (recording == Recording::kUnderPythonMode &&
      TracedArguments(*stack, op.schema().returns().size())) {  // the mode made fakes of real tensors
    observer->OpFailed(record);  // not an op on real memory after all: as if it had passed through
    return;
  }
  CaptureOutputs(record, *stack);
  if (!record.hidden_copies.empty()) KeepEscapedCopies(record);
  observer->AfterOp(std::move(record));
  RecycleAliases(record.arguments);  // a record the observer did not keep (moved from when it did: empty)
}

}  // namespace

absl::StatusOr<c10::DispatchKey> InstallHook() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (g_installed.load(std::memory_order_acquire)) return g_key;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (c10::DispatchKey key : kHookKeyCandidates) {
    if (dispatcher.hasBackendFallbackForDispatchKey(key)) continue;
    g_key = key;
    // Leaked on purpose: deregistering at exit could run after the dispatcher is gone.
    new c10::RegistrationHandleRAII(dispatcher.registerFallback(
        key, c10::KernelFunction::makeFromBoxedFunction<&Fallback>(), "remat dispatch hook"));
    g_installed.store(true, std::memory_order_release);
    return key;
  }
  std::vector<std::string> names;
  for (c10::DispatchKey key : kHookKeyCandidates) names.push_back(c10::toString(key));
  return absl::FailedPreconditionError(absl::StrCat(
      "remat: this torch build already has a fallback on every dispatch key remat can use (",
      absl::StrJoin(names, ", "),
      "), so remat cannot intercept ops; pick another key in integration/dispatch_hook.h (kHookKeyCandidates)"));
}

c10::DispatchKey HookKey() {
  TORCH_CHECK(g_installed.load(std::memory_order_acquire), "remat: the dispatch hook is not installed");
  return g_key;
}

namespace {
c10::DispatchKey InstalledKeyOrThrow() {
  absl::StatusOr<c10::DispatchKey> key = InstallHook();
  TORCH_CHECK(key.ok(), std::string(key.status().message()));
  return *key;
}
}  // namespace

ScopedHook::ScopedHook() : include_(InstalledKeyOrThrow()) {}

SuspendHook::SuspendHook() : exclude_(InstalledKeyOrThrow()) {}

absl::Status SetHookEnabledOnThisThread(bool enabled) {
  absl::StatusOr<c10::DispatchKey> key = InstallHook();
  if (!key.ok()) return key.status();
  c10::impl::tls_set_dispatch_key_included(*key, enabled);
  return absl::OkStatus();
}

bool HookEnabledOnThisThread() {
  return g_installed.load(std::memory_order_acquire) && c10::impl::tls_is_dispatch_key_included(g_key) &&
         !c10::impl::tls_is_dispatch_key_excluded(g_key);
}

bool TakesCompositeKernel(const c10::OperatorHandle& op, c10::DispatchKey key) {
  using c10::DispatchKey;
  // An autocast wrapper casts its arguments and calls the op again through the dispatcher (autocast excluded).
  if (c10::autocast_dispatch_keyset.has(key)) return true;
  // c10's OperatorEntry::computeDispatchTableEntryWithDebug, in its order: a direct registration wins (1), then the
  // CompositeExplicitAutograd kernels (2.1, 2.2), then the CompositeImplicitAutograd ones (2.3) unless the key's
  // backend has a kernel of its own.
  if (op.hasKernelForDispatchKey(key)) return false;
  for (DispatchKey alias : {DispatchKey::CompositeExplicitAutogradNonFunctional, DispatchKey::CompositeExplicitAutograd}) {
    if ((key == DispatchKey::Undefined || c10::isIncludedInAlias(key, alias)) && op.hasKernelForDispatchKey(alias)) {
      return false;
    }
  }
  const bool has_backend_kernel = op.hasKernelForAnyDispatchKey(c10::getBackendKeySetFromAutograd(key)) ||
                                  op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd);
  if (has_backend_kernel) return false;
  if (key != DispatchKey::Undefined && c10::isIncludedInAlias(key, DispatchKey::CompositeImplicitAutogradNestedTensor) &&
      op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutogradNestedTensor)) {
    return true;
  }
  if ((key == DispatchKey::Undefined || c10::isIncludedInAlias(key, DispatchKey::CompositeImplicitAutograd)) &&
      op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd)) {
    // AutogradOther with a kernel on one of its backends is an ambiguity torch reports when called: record it.
    return !(key == DispatchKey::AutogradOther && op.hasKernelForAnyDispatchKey(c10::autogradother_backends));
  }
  return false;
}

bool DecomposesAt(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below) {
  const c10::DispatchKey key = below.highestPriorityTypeId();
  const int index = c10::getDispatchTableIndexForDispatchKey(key);
  if (index < 0 || index >= static_cast<int>(traits.decomposes_at.size())) return false;  // record: always sound
  std::atomic<std::int8_t>& cached = traits.decomposes_at[static_cast<std::size_t>(index)];
  std::int8_t known = cached.load(std::memory_order_relaxed);
  if (known == 0) {
    known = TakesCompositeKernel(op, key) ? 2 : 1;
    cached.store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

const OpTraits& TraitsOf(const c10::OperatorHandle& op) {
  thread_local absl::flat_hash_map<const c10::FunctionSchema*, const OpTraits*> cache;
  const c10::FunctionSchema* key = &op.schema();
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  const OpTraits* traits = SharedTraits(op);
  cache.emplace(key, traits);
  return *traits;
}

void SetObserver(OpObserver* observer) { g_observer.store(observer, std::memory_order_seq_cst); }

void HookPrepareFork() { TraitsMutex().lock(); }

void HookParentAfterFork() { TraitsMutex().unlock(); }

void HookChildAfterFork() {
  TraitsMutex().unlock();
  // Parent threads that were inside an observer call do not exist here.
  g_observer_calls.store(0, std::memory_order_relaxed);
}

void WaitForObserverCalls() {
  while (g_observer_calls.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

// Sequentially consistent: read after an ObserverCall is counted (op_capture.h), it pairs with SetObserver(nullptr).
OpObserver* GetObserver() { return g_observer.load(std::memory_order_seq_cst); }

void RecycleAliases(c10::Stack& arguments) {
  if (arguments.empty()) return;
  std::vector<c10::intrusive_ptr<c10::TensorImpl>>& spares = t_spare_aliases;  // one TLS lookup
  for (c10::IValue& value : arguments) {
    if (spares.size() >= kMaxSpareAliases) break;
    if (!value.isTensor()) continue;
    const at::Tensor& tensor = value.toTensor();
    if (!tensor.defined()) continue;
    const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    // Only a record's own alias (plain, no version counter) that nothing else references, weakly or from Python.
    if (impl->version_counter().enabled() || tensor.use_count() != 1 || tensor.weak_use_count() != 1 ||
        typeid(*impl) != typeid(c10::TensorImpl) || impl->pyobj_slot()->load_pyobj() != nullptr) {
      continue;
    }
    c10::intrusive_ptr<c10::TensorImpl> spare = std::move(value).toTensor().unsafeReleaseIntrusivePtr();
    spare->release_resources();  // its storage reference goes now: a storage's death is its use count
    spares.push_back(std::move(spare));
  }
  arguments.clear();
}

c10::Stack ReplayArguments(const OpRecord& record) {
  c10::Stack arguments;
  arguments.reserve(record.arguments.size());
  bool replayable = true;  // already known from the capture
  for (const c10::IValue& value : record.arguments) arguments.push_back(AliasValue(value, nullptr, &replayable));
  const int index = record.traits->generator_argument;
  if (index >= 0 && record.rng.has_value()) arguments[index] = record.rng->clone();
  return arguments;
}

absl::StatusOr<c10::Stack> Replay(const OpRecord& record) { return ReplayWith(record, ReplayArguments(record)); }

namespace {

// Lends `generator` (a device's default generator) the state of `captured` for its lifetime, then gives it its own
// state back, under the generator's lock each time.
class LentGeneratorState {
 public:
  LentGeneratorState(at::Generator generator, const at::Generator& captured) : generator_(std::move(generator)) {
    const at::Tensor state = captured.get_state();  // our private copy: no lock needed
    own_ = CopyGenerator(generator_).get_state();
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(state);
  }
  ~LentGeneratorState() {
    try {
      std::lock_guard<std::mutex> lock(generator_.mutex());
      generator_.set_state(own_);
    } catch (const c10::Error& e) {  // not seen: the state was this generator's own a moment ago
      TORCH_WARN("remat: could not give ", generator_.device(), "'s default generator its state back after a replay: ",
                 e.what_without_backtrace());
    }
  }
  LentGeneratorState(const LentGeneratorState&) = delete;
  LentGeneratorState& operator=(const LentGeneratorState&) = delete;

 private:
  at::Generator generator_;
  at::Tensor own_;
};

}  // namespace

absl::StatusOr<c10::Stack> ReplayWith(const OpRecord& record, c10::Stack arguments) {
  if (!record.replayable) {
    return absl::FailedPreconditionError(
        absl::StrCat("remat: ", record.traits->name,
                     " cannot be replayed (an argument is not a plain strided tensor, or a random op's generator "
                     "state could not be captured)"));
  }
  if (arguments.size() != record.op.schema().arguments().size()) {
    return absl::InvalidArgumentError(absl::StrCat("remat: replay of ", record.traits->name, " with ",
                                                   arguments.size(), " arguments, its schema has ",
                                                   record.op.schema().arguments().size()));
  }
  // Random ops without a Generator argument, and opaque calls, draw from the default generator of the device they
  // drew from (the CPU's, CUDA's Philox state): lend it the captured state for the replay, then give it back its
  // own, so the user's random stream does not move.
  std::optional<at::Generator> default_generator;
  if (record.traits->generator_argument < 0 && record.rng.has_value()) {
    absl::StatusOr<at::Generator> generator = DefaultGeneratorOf(record.rng->device());
    if (!generator.ok()) return generator.status();
    default_generator = *std::move(generator);
  }
  try {
    c10::impl::ForceDispatchKeyGuard capture_state(record.tls_keys);
    AutocastDtypeGuard autocast_cpu(c10::DeviceType::CPU, record.autocast_cpu_dtype);
    AutocastDtypeGuard autocast_cuda(c10::DeviceType::CUDA, record.autocast_cuda_dtype);
    SuspendHook suspend;
    c10::AutoGradMode grad_mode(record.grad_enabled);
    KernelSettingsScope settings(record.kernel_settings);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::optional<LentGeneratorState> lent;
    if (default_generator.has_value()) lent.emplace(*default_generator, *record.rng);
    record.op.callBoxed(arguments);
  } catch (const std::exception& e) {
    if (IsOutOfMemory(e)) return absl::ResourceExhaustedError(MessageOf(e));
    return absl::InternalError(absl::StrCat("remat: replay of ", record.traits->name, " failed: ", MessageOf(e)));
  }
  return arguments;  // callBoxed replaced the arguments with the returns
}

absl::StatusOr<int> RestoreOutputs(const OpRecord& record, const c10::Stack& replayed) {
  std::vector<std::pair<int, at::Tensor>> tensors;
  ForEachReturnedTensor(replayed, record.op.schema().returns().size(), [&](int r, const at::Tensor& tensor) {
    if (StridedOverStorage(tensor)) tensors.emplace_back(r, tensor);
  });
  if (tensors.size() != record.outputs.size()) {
    return absl::FailedPreconditionError(absl::StrCat("remat: replay of ", record.traits->name, " returned ",
                                                      tensors.size(), " tensors, the recorded run ",
                                                      record.outputs.size()));
  }
  std::vector<const c10::StorageImpl*> restored;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const CapturedOutput& output = record.outputs[i];
    if (output.input_storage >= 0) continue;  // an alias of an input: restoring the input restores it
    c10::intrusive_ptr<c10::StorageImpl> target = output.storage.lock();
    if (!target || !IsEvicted(*target)) continue;
    if (std::find(restored.begin(), restored.end(), target.get()) != restored.end()) continue;
    const at::Tensor& tensor = tensors[i].second;
    if (tensors[i].first != output.return_index || !SameLayout(MetaOf(tensor), output.meta)) {
      return absl::FailedPreconditionError(absl::StrCat("remat: replay of ", record.traits->name,
                                                        " produced a different layout for output ", i));
    }
    absl::Status status = RestoreStorage(*target, output.storage_nbytes, *tensor.storage().unsafeGetStorageImpl());
    if (!status.ok()) return status;
    restored.push_back(target.get());
  }
  return static_cast<int>(restored.size());
}

}  // namespace remat::integration
