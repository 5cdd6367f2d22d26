// Hidden copies: the copy autograd saves inside an in-place op of the value the op overwrites (OpRecord::
// hidden_copies, dispatch_hook.h). autograd's kernel for an in-place op whose backward reads the old value (silu_,
// hardswish_, hardtanh_ for ReLU6, mul_ by a tensor that requires grad) runs `original_self = self.clone()` before
// the write and keeps the clone in the op's grad_fn. The clone is a call inside a recorded op, so the hook would pass
// it through unseen; its memory would then be arena memory no engine storage holds (never evictable, a barrier to
// compaction) until backward reads it.
//
// Contract (the dispatch hook is the only caller):
//   - WatchesCopies: whether the op about to be recorded may make such a copy (it writes an argument, grad mode is
//     on and some tensor argument requires grad). Only then does the hook let the op's nested calls through its
//     fallback (they cost one boxed call each), inside a CopyWatch.
//   - CopyWatch (RAII, per thread): the recorded op whose nested calls are watched; WatchedOp() is it, or null.
//   - WrittenInputCloned: for a nested call about to run, the index in the watched record's input_storages of the
//     written input it clones (aten::clone of that storage), or -1. KeepCopy: after that clone ran, keeps its result
//     in the record (whole_storage when the copy can stand for the input's whole storage).
//   - KeepEscapedCopies: after the op, drops the copies that died with it (a kernel's temporaries) or that it
//     returned; what is left is what autograd kept.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>

#include "integration/dispatch_hook.h"

namespace remat::integration {

bool WatchesCopies(const OpTraits& traits, const torch::jit::Stack& stack, std::size_t first_argument);

class CopyWatch {
 public:
  explicit CopyWatch(OpRecord* record);  // null: nothing watched
  ~CopyWatch();
  CopyWatch(const CopyWatch&) = delete;
  CopyWatch& operator=(const CopyWatch&) = delete;

 private:
  OpRecord* outer_;
};

OpRecord* WatchedOp();

int WrittenInputCloned(const OpRecord& record, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// `self` is the clone's argument, `copy` its result.
void KeepCopy(OpRecord& record, int input_storage, const at::Tensor& self, const at::Tensor& copy);

void KeepEscapedCopies(OpRecord& record);

}  // namespace remat::integration
