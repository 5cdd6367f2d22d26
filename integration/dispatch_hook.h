// Dispatch hook: remat sees every ATen op run on a thread where it is enabled, forward and backward, through one
// boxed fallback on a dispatch key held in the thread-local included set (DESIGN.md, "PyTorch integration").
//
// The key. torch has no key reserved for out-of-tree interceptors, so we borrow one that stock torch registers no
// fallback on: DeferredInit, else TESTING_ONLY_GenericMode (kHookKeyCandidates, the one place to change it).
// InstallHook checks hasBackendFallbackForDispatchKey, registers the fallback once per process and returns the
// key; if both candidates are taken it fails with a clear error. Both keys sit above Autograd, so the hook sees
// an op before autograd records it; composite ops are seen as their decomposition (aten::native_dropout for
// aten::dropout, aten::convolution for aten::conv2d), the ops autograd records.
//
// Switching on. The key must be in the thread's included set: ScopedHook (RAII) or SetHookEnabledOnThisThread
// (Python's global switch). autograd's engine threads copy the calling thread's dispatch key set into the graph
// task, so backward ops run by `backward()` on an enabled thread are seen too. Other threads are not affected.
//
// What the fallback does:
//   - no observer installed, or an op nested inside another seen op, or one of our own remat:: ops: redispatch
//     below the key at once (the pass-through path: one TLS read, one atomic load). A recorded op's kernel runs
//     with the key excluded, so its own at:: calls do not even reach the fallback; threads that copy the kernel's
//     dispatch key state (at::launch, a backward pass the kernel runs) do the same: their ops are part of the op.
//     Except for an op that writes an argument while autograd records it: its nested calls come through the
//     fallback and pass on, and a clone of an argument it writes that outlives the op without being returned
//     (autograd's saved original) is kept in OpRecord::hidden_copies;
//   - an op traced or transformed rather than run on real memory (a Python dispatch mode such as FakeTensor, a
//     tensor subclass, functionalization, functorch, meta tensors: their keys below the hook): it passes through,
//     so torch.compile's tracing is untouched, and the ops it then runs on real tensors are recorded. A subclass over
//     real tensors (DTensor, a quantized weight) runs the op on its inner tensors where the hook cannot see: they are
//     held resident for the call, and what was computed from those it writes is pinned first (subclass_arguments.h,
//     RunSubclassOp). Except an op on real tensors under a Python dispatch mode (FlopCounterMode, selective
//     checkpointing): the mode's handler runs its kernels with this key excluded, so it is recorded here, the
//     handler being part of its kernel, and is not replayable (the mode may change what it returns);
//   - an op whose kernel for the key set below the hook is its CompositeImplicitAutograd kernel (or an autocast
//     wrapper): it passes through and the ops it calls, which the hook sees, are recorded. Decided per op and per
//     dispatch key from the dispatcher's own rules (DecomposesAt), not from the mere existence of a composite
//     kernel: aten::silu_backward has a composite kernel and a CPU kernel, and on CPU the CPU kernel runs, so it is
//     recorded. A composite kernel may also read an argument's bytes itself, through a raw pointer it keeps across
//     its nested ops (aten::lstm.data and aten::_pad_packed_sequence read batch_sizes, ctc_loss its lengths): so
//     while it runs, the arguments it may read so (op_capture.h, CompositeArguments: integer and boolean tensors)
//     are brought back, and every argument that is resident is kept resident and in place (OpObserver's
//     BeginComposite, EndComposite). A floating-point argument that is evicted stays so: the kernel only hands it
//     to the ops it calls, which bring it back, or reads its sizes (expand_as in index_add's backward). Autocast
//     wrappers only cast and call again: they pass through as they are;
//   - otherwise it captures an OpRecord (operator, arguments as detached aliases over the same storages, input
//     storages, a copy of the generator for random ops, the thread's dispatch key state), calls the observer's
//     BeforeOp, runs the op, fills in outputs and duration and calls AfterOp. Only outermost ops are recorded:
//     an op's internal calls are part of it, and its recomputation replays them all.
//
// Replays (Replay, ReplayWith) run the recorded op again with the key excluded, below autograd and
// ADInplaceOrView (no graph is recorded, no version counters bump), under the dispatch key state and autocast
// dtypes of the capture, and with the captured generator state, so a random op reproduces its bits. The user's RNG
// stream is not advanced by a replay.
//
// Thread safety: the fallback runs on whatever thread runs the op (the user's, autograd's). The observer is
// called on that thread and must be thread safe; SetObserver may be called at any time, and after
// SetObserver(nullptr) WaitForObserverCalls() returns once every op that loaded the old observer has returned.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/kernel_settings.h"

namespace remat::integration {

// In order of preference. The first one torch has no fallback for is used.
inline constexpr std::array<c10::DispatchKey, 2> kHookKeyCandidates = {c10::DispatchKey::DeferredInit,
                                                                         c10::DispatchKey::TESTING_ONLY_GenericMode};

// Registers the fallback (once per process; later calls return the same key) and returns the key it is on.
absl::StatusOr<c10::DispatchKey> InstallHook();

// The key of an installed hook. Precondition: InstallHook() succeeded.
c10::DispatchKey HookKey();

// While alive, the hook sees ops run on this thread. Throws c10::Error if the hook cannot be installed.
class ScopedHook {
 public:
  ScopedHook();
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;

 private:
  c10::impl::IncludeDispatchKeyGuard include_;
};

// While alive, the hook sees nothing on this thread (what replays and the runtime's own tensor work use).
class SuspendHook {
 public:
  SuspendHook();
  SuspendHook(const SuspendHook&) = delete;
  SuspendHook& operator=(const SuspendHook&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard exclude_;
};

// The non-RAII switch behind Python's remat.enable()/disable(): puts the key in (or takes it out of) this thread's
// included set. Installs the hook if needed.
absl::Status SetHookEnabledOnThisThread(bool enabled);
// The key is included and not excluded (SuspendHook) on this thread.
bool HookEnabledOnThisThread();

// What the schema says about an operator, computed once per operator and cached.
struct OpTraits {
  std::string name;  // "aten::add_.Tensor"
  // Recorded at all (false for remat:: ops, which pass through).
  bool tracked = true;
  // Per runtime dispatch key (c10::getDispatchTableIndexForDispatchKey): 0 not known yet, 1 the kernel taken at
  // that key does the work itself (the op is recorded), 2 it is the op's CompositeImplicitAutograd kernel or an
  // autocast wrapper (aten::conv2d, aten::dropout, aten::matmul, aten::lstm on CPU): the op passes through and the
  // ops it calls are recorded instead, so every tensor autograd saves is an output of a recorded op (evictable)
  // rather than memory produced inside an op (a constant). Filled lazily by DecomposesAt.
  mutable std::array<std::atomic<std::int8_t>, c10::num_runtime_entries> decomposes_at{};
  // Running it again recomputes its outputs and nothing else (false for collectives and profiler ops).
  bool replayable = true;
  // Draws random numbers: has a Generator argument, or is one of the known generator-less random ops (dropout).
  bool random = false;
  int generator_argument = -1;  // index of its `Generator?` argument, or -1
  // Arguments the op writes (alias annotation `!`): in-place `self`, `out=` tensors.
  std::vector<int> written_arguments;
  // It writes an argument no return aliases and returns fresh tensors: a call is replayable only if its outputs
  // ignore what it writes (op_effects.h, OutputsIgnoreSideWrites).
  bool writes_unreturned = false;
  std::vector<bool> out_argument;  // per written argument: keyword-only, i.e. an out= argument
  // Per return: the argument it aliases according to the schema (`Tensor(a)`), or -1 for fresh memory.
  std::vector<int> return_aliases;
  // Some return is a view of an argument without writing it (view, transpose, split, ...).
  bool is_view = false;
  // Its outputs are uninitialized memory (aten::empty and friends: op_effects.h ProducesUninitializedMemory),
  // decided once here rather than by name on every op.
  bool uninitialized = false;
  // A matrix product, convolution, recurrent layer or attention (policies/costly_ops.h): its kernel may compute at
  // a reduced float32 precision (TF32, oneDNN bf16), which its record captures (KernelSettings::Capture).
  bool reads_float32_precision = false;
};

const OpTraits& TraitsOf(const c10::OperatorHandle& op);

// Whether the kernel the dispatcher takes for `op` at runtime key `key` (the highest key of the set below the hook)
// is `op`'s CompositeImplicitAutograd kernel (mirrors c10's computeDispatchTableEntry, steps 1 to 2.3) or an
// autocast wrapper (which casts and calls the op again through the dispatcher). Uncached; see DecomposesAt.
bool TakesCompositeKernel(const c10::OperatorHandle& op, c10::DispatchKey key);
// TakesCompositeKernel for the highest key of `below`, cached in `traits`.
bool DecomposesAt(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below);

// Shape of one tensor at capture time: enough to check a replay reproduced the same layout.
struct TensorMeta {
  // Inline up to 6 dimensions: no allocation per output for the tensors of almost every model.
  c10::SmallVector<std::int64_t, 6> sizes;
  c10::SmallVector<std::int64_t, 6> strides;
  std::int64_t storage_offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

struct CapturedOutput {
  int return_index = 0;  // which return (a list return gives several outputs with the same index)
  // Weak: a record does not keep its outputs alive.
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
  std::size_t storage_nbytes = 0;                     // the storage's size when the op returned
  TensorMeta meta;
  // Index into OpRecord::input_storages when the output shares an input's storage (a view, an in-place or out=
  // result, an op that returned its input), else -1: the op produced this storage.
  int input_storage = -1;
};

// A record's input storages: inline for the usual few (no allocation per op).
using InputStorages = absl::InlinedVector<c10::intrusive_ptr<c10::StorageImpl>, 4>;

struct OpRecord {
  // Captures the calling thread's dispatch key state.
  OpRecord(c10::OperatorHandle handle, const OpTraits& op_traits)
      : op(std::move(handle)),
        traits(&op_traits),
        tls_keys(c10::impl::tls_local_dispatch_key_set()),
        grad_enabled(c10::GradMode::is_enabled()),
        kernel_settings(KernelSettings::Capture(op_traits.reads_float32_precision)) {}

  c10::OperatorHandle op;
  const OpTraits* traits;
  // The arguments as the op received them; every plain tensor is a detached alias (no autograd history) of the
  // same StorageImpl with the same sizes, strides and offset, taken before the op ran.
  c10::Stack arguments;
  // The distinct storages of the tensor arguments, in argument order. Strong references: a storage the record may
  // need to recompute from stays alive (its memory may still be evicted).
  InputStorages input_storages;
  // Filled after the op ran, in return order, one per defined tensor (lists flattened).
  absl::InlinedVector<CapturedOutput, 1> outputs;
  // Random ops: a copy of the generator the op drew from, as it was before the op ran.
  std::optional<at::Generator> rng;
  // Arguments this call writes although the schema does not say so (op_effects.h: batch norm's running statistics
  // in training mode). Written on the side: constants, replayed on fresh memory.
  std::vector<int> unannotated_writes;
  // False when a replay could not reproduce the op: the op has side effects (OpTraits::replayable), a tensor
  // argument is not a plain strided tensor with a
  // storage (sparse, a Python subclass, a functorch wrapper: kept as is in `arguments`, not detached), or a random
  // op's generator could not be captured (its arguments on two devices, a device torch has no generator for).
  bool replayable = true;
  // The thread's dispatch key state at capture (autocast on/off and friends), restored for a replay.
  c10::impl::LocalDispatchKeySet tls_keys;
  // Grad mode at capture, restored for a replay: some kernels return more when it is on (mkldnn_rnn_layer's
  // workspace), and replays run from backward, where it is off.
  bool grad_enabled;
  // The process-wide settings that choose what a kernel computes (default dtype, thread count, backend flags),
  // restored for a replay (kernel_settings.h).
  KernelSettings kernel_settings;
  // The autocast dtypes in effect at capture, for the devices whose autocast was on; restored for a replay.
  std::optional<c10::ScalarType> autocast_cpu_dtype;
  std::optional<c10::ScalarType> autocast_cuda_dtype;
  std::uint64_t duration_ns = 0;  // the op's wall time, nested calls included
  // Run by autograd's engine as part of a backward pass (torch::autograd::get_current_graph_task_id): its outputs
  // are gradients, or values computed to produce them.
  bool in_backward = false;
  // Copies of a written input's value before the op that outlive the op without being its outputs: autograd's
  // saved original of an in-place op whose backward reads it (`original_self = self.clone()` in the autograd
  // kernel of silu_, hardtanh_, mul_, ...). Made inside the op, so the hook would not see them otherwise; the
  // observer takes them over (AfterOp) so that they are evictable, or at least known, instead of hidden memory.
  struct HiddenCopy {
    int input_storage = -1;  // the written input it copies (index into input_storages)
    c10::intrusive_ptr<c10::StorageImpl> copy;
    // The copy's storage holds the input storage's bytes as they were (same size, strides and offset 0 on both
    // sides, the input covering its whole storage): it can stand for that storage's old version.
    bool whole_storage = false;
  };
  std::vector<HiddenCopy> hidden_copies;
};

// Implemented by the runtime. Called for every recorded (outermost) op on the thread that runs it.
// What an observer's BeginComposite took and EndComposite gives back: (observer, engine tensor) pairs.
struct CompositeHold {
  absl::InlinedVector<std::pair<const void*, std::uint32_t>, 4> held;
};

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // Before the op runs: `record` has everything but outputs and duration. Make every input storage resident
  // (rematerialize evicted ones) and lock what must not be evicted while the op runs.
  virtual void BeforeOp(OpRecord& record) = 0;
  // After the op returned, with outputs and duration. The observer may keep the record.
  virtual void AfterOp(OpRecord&& record) = 0;
  // The same, for an observer chained behind another that keeps the record (BridgeOptions::next): the record is
  // only lent for the call. An observer that never keeps records overrides it to save the copy.
  virtual void AfterOpLent(const OpRecord& record) {
    OpRecord copy = record;
    AfterOp(std::move(copy));
  }
  // The op threw after BeforeOp returned (release locks); the exception then propagates.
  virtual void OpFailed(OpRecord& record) noexcept = 0;
  // The op's kernel threw c10::OutOfMemoryError. It writes none of its arguments, draws no random numbers and has
  // no other side effect (OpTraits), so it can run again on the same arguments with the same result: return true to
  // have it run again (the observer has made room that was not there), false to let the error propagate (OpFailed
  // follows). Asked at most kMaxOutOfMemoryRetries times per op. An exception it throws (making room failed for
  // another reason than memory) propagates instead of the out-of-memory error, OpFailed first.
  virtual bool RetryAfterOutOfMemory(OpRecord& record) { return false; }
  // A composite op runs next (its decomposition passes through the hook, its nested ops are recorded) on these
  // storages (its plain tensor arguments', each once; op_capture.h, CompositeArguments): bring back the evicted or
  // paged ones of `read_raw`, and keep those and every resident one of `passed_on` resident and in place (not
  // evicted, paged out or moved) until EndComposite with the same `hold`, in which the observer notes what it holds;
  // an evicted or paged one of `passed_on` is left where it is. An exception it throws (no memory to bring one back)
  // propagates; nothing is then held. EndComposite comes after the op returned or threw.
  virtual void BeginComposite(std::span<c10::StorageImpl* const> read_raw,
                              std::span<c10::StorageImpl* const> passed_on, CompositeHold& hold) {}
  virtual void EndComposite(CompositeHold& hold) noexcept {}
  // A composite op ran out of memory and can run again from the start (composite_attempt.h): its kernel has
  // unwound and EndComposite released its arguments. Return true to have it run again (the observer has made room
  // that was not there: the hole the last failed allocation asked for), false to let the error propagate. Asked at
  // most kMaxOutOfMemoryRetries times per call; an exception it throws propagates instead of the error.
  virtual bool RetryCompositeAfterOutOfMemory() { return false; }
};

inline constexpr int kMaxOutOfMemoryRetries = 4;

// nullptr makes every op pass through. The observer is not owned.
void SetObserver(OpObserver* observer);
// Returns once no thread is inside an observer call that started before: after SetObserver(nullptr), the old
// observer may then be destroyed. Must not be called from inside an observer call (it would wait for itself).
void WaitForObserverCalls();

// fork(): the hook's part of the process's fork handlers (engine_session.cc installs them).
void HookPrepareFork();
void HookParentAfterFork();
void HookChildAfterFork();
OpObserver* GetObserver();

// Empties a dead record's arguments, keeping its aliases' TensorImpls (without their storages) for the hook's next
// captures on this thread instead of destroying them. For the record's owner, when it drops the record.
void RecycleAliases(c10::Stack& arguments);

// Fresh detached aliases of the record's arguments (a replay may resize an out= argument; the record's own
// aliases stay untouched) with a fresh copy of the captured generator in the Generator argument, if any.
c10::Stack ReplayArguments(const OpRecord& record);

// Runs the recorded op on ReplayArguments(record), or on `arguments` (same schema; the runtime substitutes inputs,
// e.g. the rematerialized old value of an in-place op's input). Returns the op's returns.
absl::StatusOr<c10::Stack> Replay(const OpRecord& record);
absl::StatusOr<c10::Stack> ReplayWith(const OpRecord& record, c10::Stack arguments);

// Moves the memory of the replayed outputs into every output storage of `record` that is alive and evicted
// (EvictStorage) and that the op produced (input_storage == -1). Checks that each replayed output has the
// recorded layout. Returns how many storages were restored.
absl::StatusOr<int> RestoreOutputs(const OpRecord& record, const c10::Stack& replayed);

}  // namespace remat::integration
