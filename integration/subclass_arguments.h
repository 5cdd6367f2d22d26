// Ops on Python tensor subclasses that hold real tensors (wrapper subclasses: DTensor, quantized and scaled
// weights, logging and tracing wrappers; DESIGN.md "PyTorch integration").
//
// Such an op reaches the hook with the Python key below it and passes through unrecorded (traced_calls.h): the
// subclass's __torch_dispatch__ then runs the work on its inner tensors with every key above Python excluded, the
// hook's among them, so remat sees none of it. Two things must not happen there:
//   - a read of an inner tensor remat evicted (a result of a recorded op that a subclass wraps, as
//     DTensor.from_local does) or moves while the kernel runs: the inner storages the op reads are brought back and
//     fixed first (EngineBridge::MakeResident, read-only);
//   - a write remat does not see to a storage recorded ops read: an optimizer's add_ on a DTensor parameter writes
//     its local tensor, whose plain alias (to_local()) the forward's recorded matmuls read; a replay after the write
//     would read the new bytes. The inner storages of the arguments the op writes (schema `!`) are treated as a
//     write to a constant first (EngineBridge::StorageWillChange: what was computed from them is pinned).
// Only Python knows a subclass's inner tensors (__tensor_flatten__, or the tensors among its attributes), so the
// Python package registers a callback (remat/_subclasses.py) that the hook calls once per such op, with its subclass
// arguments, before the op passes through: for the arguments the op writes it announces the change itself
// (remat::inner_tensors_will_change, EngineBridge::StorageWillChange per storage, which also fixes them), and for
// those it reads it names the inner tensors (remat::hold_inner_reads, which calls NoteInnerReads), which the hook
// then holds resident and in place while the op runs (OpObserver's BeginComposite and EndComposite, as for a
// composite op's arguments). Without a callback (C++ only, where no Python subclass exists) nothing is called.
// Arguments that are traced rather than real (FakeTensor and other meta-backed tensors) and calls under functorch's
// transforms or functionalization are skipped.
#pragma once

#include <cstddef>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

namespace remat::integration {

struct OpTraits;

// Called with the op's subclass arguments as PyObjects (borrowed), whether the op writes each (1) or not (0), their
// count, and a buffer for an error message. Returns 0 on success, 1 on an error, 2 when bringing memory back ran out
// of it (the message says so).
using SubclassArgumentCallback = int (*)(void* const* py_tensors, const int* written, std::size_t count, char* message,
                                         std::size_t message_size);

// Registers the callback (nullptr: none). Any thread; the hook loads it atomically.
void SetSubclassArgumentCallback(SubclassArgumentCallback callback);

// An op that passes through the hook with `below` holding the Python key (dispatch_hook.cc's Fallback): calls the
// callback once with the arguments that are Python subclass tensors with real data, if any, then runs the op below
// the hook with the inner tensors the callback named as read held resident and in place. Throws
// c10::OutOfMemoryError or c10::Error with the callback's message when it fails (the op does not run).
void RunSubclassOp(const c10::OperatorHandle& op, const OpTraits& traits, c10::DispatchKeySet below,
                   torch::jit::Stack* stack);

// An inner tensor a subclass named that holds real memory remat may track: plain (strided over a storage, no Python
// subclass), not meta, not a functional or functorch wrapper.
bool RealInnerTensor(const at::Tensor& tensor);

// The callback's answer (remat::hold_inner_reads): the op about to run reads `tensors`' storages. Ignored outside
// a callback on this thread.
void NoteInnerReads(const std::vector<at::Tensor>& tensors);

}  // namespace remat::integration
