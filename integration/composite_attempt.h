// CompositeAttempt: whether a composite op that ran out of memory may run again from the start.
//
// A composite op (DecomposesAt) keeps its resident arguments in place while it runs (BeginComposite): a kernel it
// calls cannot move them to make a hole, so a large buffer one of its ops asks for may find none, with enough
// free memory on both sides of an argument. Once the composite's kernel has unwound, nothing reads its arguments:
// they may move, and the composite can run again, if running it again gives the same result and repeats nothing.
// That holds when its schema says it writes none of its arguments and draws no random numbers, each tensor
// argument is plain (its storages known), and no op it ran before it failed
//   - wrote a storage of one of its arguments (an op nested deeper counts for every composite around it),
//   - drew random numbers, or moved the default generator (NoteGeneratorMoved: the observer sees that),
//   - ran under a Python dispatch mode, or could not be replayed (a side effect remat cannot repeat).
// Ops it ran wrote only memory they made; what they left is dropped with the attempt.
//
// Contract: one CompositeAttempt per composite call, on the thread that runs it, constructed after its arguments
// are held and destroyed after EndComposite; attempts nest (the innermost is the thread's current). RecordOp calls
// NoteRecordedOp for every op it records. Each thread has its own chain of attempts.
#pragma once

#include "integration/dispatch_hook.h"
#include "integration/op_capture.h"

namespace remat::integration {

class CompositeAttempt {
 public:
  // `arguments` are the composite's argument storages (CompositeArguments); they must outlive the attempt.
  // `repeatable_by_schema`: the schema lets it run again (no written argument, not random, replayable, every tensor
  // argument plain).
  CompositeAttempt(const CompositeArgumentStorages& arguments, bool repeatable_by_schema);
  // An attempt that cannot be repeated makes the enclosing one unrepeatable too (its ops were the enclosing's ops).
  ~CompositeAttempt();
  CompositeAttempt(const CompositeAttempt&) = delete;
  CompositeAttempt& operator=(const CompositeAttempt&) = delete;

  bool repeatable() const { return repeatable_; }

  // Every op recorded on this thread, before its kernel runs: nothing unless an attempt is current (on every
  // recorded op: one thread-local read).
  static void NoteRecordedOp(const OpRecord& record, bool under_python_mode);
  // The op the observer is finishing on this thread moved the default generator although not known to be random.
  static void NoteGeneratorMoved();

 private:
  bool Owns(const c10::StorageImpl* storage) const;

  const CompositeArgumentStorages& arguments_;
  CompositeAttempt* enclosing_;
  bool repeatable_;
};

}  // namespace remat::integration
