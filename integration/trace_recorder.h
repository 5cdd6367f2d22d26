// Trace recorder: writes the op stream the dispatch hook sees as a trace in the DTR prototype's JSON-lines
// format (../shared/traces/dtr/README.md), which runtime/trace.h parses and remat-sim replays.
//
// Mapping from torch to the trace (names are "t<N>", never reused):
//   - a storage first seen as an argument (parameter, input, anything made before recording or outside the
//     hook) becomes a CONSTANT with MEMORY = its bytes (0 when the budget does not count it: `counts` below);
//   - an op that writes an argument (in-place, out=) is a MUTATE whose MUTATE indices point at the written
//     tensors in ARGS;
//   - any other op is a CALL; each result gets MEMORY and ALIAS: -1 and its storage's bytes for a fresh storage,
//     else the ARGS index of the argument whose storage it shares and the view's own bytes;
//   - ARGS name storages (a view used as an argument is named by its storage), so aliasing is by storage, which
//     is the unit remat evicts; a view result's name is RELEASEd right after its CALL (it is never an argument);
//   - when a storage dies (its last tensor is gone; references remat's own op records hold do not count, see
//     held_references.h), every name on it is RELEASEd, detected at the next op or at Close. Names alive at Close are the trace's outputs.
//   - an op that writes arguments and also returns fresh storages (batch norm's running statistics) is a CALL of
//     its results: remat's engine does not model such writes either (engine_bridge.h);
//   - remat's extensions (runtime/trace.h): `ANNOTATE BACKWARD` where autograd's engine starts running ops and
//     `ANNOTATE FORWARD` where it stops (the optimizer step is not part of the backward pass), and a PIN line for
//     each storage the engine bridge pins for good (OnPinned: a result it cannot replay, optimizer state, what a
//     write to a constant would change, an export), right after the op that produced it or before the op whose
//     write made the pin necessary, so that remat-sim replays what the PyTorch path did.
// TIME is the op's measured wall time (nested calls included), or with `estimated_costs` the estimate the engine
// uses for it (op_cost.h), so that remat-sim makes the choices the engine made. Ops whose only tensors are not
// strided (sparse) contribute only their strided tensors.
//
// Thread safety: OnOp may be called from any thread (autograd's engine); calls are serialized.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/dispatch_hook.h"

namespace remat::integration {

class TraceRecorder {
 public:
  // `counts`, when set, says whether a storage's bytes count against the budget: a storage for which it answers
  // false (a parameter made before enable, outside the arena) gets MEMORY 0, so that a replay at the run's budget
  // charges it what the engine charged (without it, resnet50's parameters made remat-sim run out at a budget the
  // run trained at). Unset: every storage counts its bytes. Called under the recorder's lock, from any thread.
  using CountsAgainstBudget = std::function<bool(c10::StorageImpl&)>;
  // Creates (truncates) the file and writes the START annotation.
  static absl::StatusOr<std::unique_ptr<TraceRecorder>> Open(const std::string& path, bool estimated_costs = false,
                                                             CountsAgainstBudget counts = nullptr);
  // Writes into memory instead (plan mode's recording of an iteration, integration/plan_driver.h); TakeText closes it
  // and returns the trace.
  static std::unique_ptr<TraceRecorder> InMemory(bool estimated_costs, CountsAgainstBudget counts = nullptr);
  std::string TakeText();
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  void OnOp(const OpRecord& record);
  // A storage that exists now and holds memory though no op may touch it (a gradient the loop frees only later): a
  // CONSTANT now, released when it dies, so that a replay counts its bytes while the program keeps it.
  void Declare(c10::StorageImpl& storage);
  // The engine bridge lets the op about to run overwrite all of `storage`, a blank constant (an aten::empty result
  // nobody wrote; engine_bridge.h): the op is written as a CALL that makes its new value (the old names RELEASEd
  // first), as the engine sees it, not as a MUTATE of a pinned storage.
  void OnBlankOverwritten(const c10::StorageImpl* storage);
  // The engine bridge pinned `storage` for good: a PIN line if the trace has named it.
  void OnPinned(const c10::StorageImpl* storage);
  // Writes the pending releases and closes the file; errors if any write failed. Idempotent.
  absl::Status Close();
  // OK, or the error of the first write that failed (a full disk: DataLoss naming the file and the cause); a write
  // fails when the stream's buffer goes to the file, so it is seen some kilobytes after the line that was lost. The
  // session reports it at the next call that reads remat's state (session.h: TraceWriteStatus).
  absl::Status WriteStatus() const;
  std::uint64_t ops_written() const;
  const std::string& path() const { return path_; }

 private:
  struct Known {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    std::vector<std::string> names;  // the first is the storage's own (a view's name is released at once)
  };

  TraceRecorder(std::string path, std::ofstream out, bool estimated_costs);
  void ReleaseDead();
  // After each write: notes the first failure (and errno then).
  void NoteWriteFailure();
  absl::Status WriteError(int error_number) const;
  const std::string& NameOf(const at::Tensor& tensor);
  const std::string& NameOfStorage(c10::StorageImpl& storage);
  // `bytes` when the budget counts `storage` (`counts`; always without it), else 0.
  std::size_t BudgetedBytes(c10::StorageImpl& storage, std::size_t bytes) const;
  std::string NewName();

  mutable std::mutex mutex_;
  std::string path_;
  std::ofstream out_;
  std::ostringstream memory_;  // InMemory
  bool in_memory_ = false;
  std::ostream* stream_;       // out_ or memory_
  CountsAgainstBudget counts_;
  bool closed_ = false;
  bool write_failed_ = false;
  int write_errno_ = 0;  // errno when the first failure was seen
  const bool estimated_costs_;
  bool in_backward_ = false;  // the last op written ran in a backward pass
  std::uint64_t next_name_ = 0;
  std::uint64_t ops_written_ = 0;
  absl::flat_hash_map<const c10::StorageImpl*, Known> known_;
  absl::flat_hash_set<const c10::StorageImpl*> overwritten_;  // OnBlankOverwritten, for the next OnOp
};

}  // namespace remat::integration
