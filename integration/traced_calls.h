// Which calls reaching the dispatch hook run on real memory and which a tracer makes (dispatch_hook.h, "What the
// fallback does"): FakeTensor and other dispatch modes and subclasses, functionalization, functorch's transforms,
// meta tensors, symbolic sizes. A traced call passes through the hook unrecorded, so torch.compile's tracing is
// untouched; the ops it runs on real tensors come back through the hook and are recorded. The exception is a call
// on real tensors under a Python dispatch mode, which the hook records (OnRealTensorsUnderPythonMode).
#pragma once

#include <cstddef>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

namespace remat::integration {

// Keys below the hook that mean the op does not run on real memory here, or runs it through Python or a transform
// that calls the dispatcher again on plain tensors.
bool Tracing(c10::DispatchKeySet below);

// What a call's arguments (the last `num_arguments` values of `stack`) say about it:
//   kTraced: a traced tensor (symbolic sizes, meta, or a Python subclass such as a FakeTensor, which reaches the hook
//     with the Python key excluded inside a mode's or subclass's handler, where the key set below does not show it),
//     or, when no argument is a tensor (a factory), a symbolic size or the meta device (aten::empty_strided with
//     symbolic sizes while Dynamo fakes a tensor has no tensor argument to carry the key of a mode or of meta);
//   kRealTensors: at least one tensor argument, none traced (symbolic sizes only exist where tensors are fake);
//   kNoTensors: no tensor argument and nothing traced.
enum class ArgumentKind { kTraced, kRealTensors, kNoTensors };
ArgumentKind KindOfArguments(const torch::jit::Stack& stack, std::size_t num_arguments);

inline bool TracedArguments(const torch::jit::Stack& stack, std::size_t num_arguments) {
  return KindOfArguments(stack, num_arguments) == ArgumentKind::kTraced;
}

// An op on real tensors that a Python dispatch mode (FlopCounterMode, selective checkpointing's caching mode,
// DebugMode, make_fx) will see below autograd: the mode's handler runs the op's kernels with every key above the
// Python key excluded, the hook's among them, so the op is recorded at the hook or not at all, and an input remat
// evicted must be brought back there. Only the thread's mode stack may put the Python key below the hook (a
// subclass's tensor carries it: kTraced), no other tracing key may be there, and at least one argument must be a
// real tensor: a factory op under FakeTensorMode makes a fake tensor.
bool OnRealTensorsUnderPythonMode(c10::DispatchKeySet below, const torch::jit::Stack& stack,
                                  std::size_t num_arguments);

}  // namespace remat::integration
