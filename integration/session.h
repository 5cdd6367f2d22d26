// Session: remat switched on for a process, the C++ API behind the Python package and the torch ops.
//
// EnableRemat installs the CPU arena with the budget as a hard limit (process-wide: every CPU tensor allocated
// from then on, on any thread, comes from it) and switches the dispatch hook on for the calling thread, with an
// observer attached. Until the runtime plugs in, the observer only tracks: it counts the ops it sees (forward
// ops of this thread, and backward ops of backward passes started from it) and their time; nothing is evicted,
// so a budget too small for the model raises c10::OutOfMemoryError.
//
// DisableRemat switches the hook off on the calling thread, detaches the observer and gives torch back its CPU
// allocator; tensors allocated under the arena keep working and free into it (see cpu_allocator.h).
//
// RematGuard is the RAII form for LibTorch programs. Enable/Disable are serialized by a mutex; enabling twice is
// an error (AlreadyExists), so a guard never silently changes an outer budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/cpu_allocator.h"
#include "integration/trace_recorder.h"

namespace remat::integration {

struct RematOptions {
  std::size_t budget = 0;  // bytes; > 0
  // false: the caller manages the memory (the engine on a CUDA device's arena); no CPU arena is installed, budget is
  // not used, and the stats report no arena.
  bool install_cpu_arena = true;
  // > 0: the CPU arena stitches granules of this many bytes (InstallCpuArena; issue 18).
  std::size_t stitch_granule = 0;
};

absl::Status EnableRemat(const RematOptions& options);
absl::Status DisableRemat();
// The first half of DisableRemat, for callers that must work between the two (the engine session brings evicted
// storages back once torch's allocator serves again): gives torch its CPU allocator back, if this session
// installed the arena; remat stays enabled otherwise. DisableRemat then does the rest. Idempotent.
absl::Status ReleaseCpuArena();
bool RematEnabled();

// fork(): the session's part of the process's fork handlers (engine_session.cc installs them). In the child, the
// trace being recorded (the parent's file) is dropped unwritten.
void SessionPrepareFork();
void SessionParentAfterFork();
void SessionChildAfterFork();

struct RematStats {
  bool enabled = false;
  bool has_arena = false;  // false before the first EnableRemat
  CpuArenaStats arena;     // of the current arena, else of the last one
  // Since the last EnableRemat: outermost ops the hook recorded, those that were random, their summed time.
  std::uint64_t ops_recorded = 0;
  std::uint64_t random_ops_recorded = 0;
  std::uint64_t op_time_ns = 0;
};

RematStats GetRematStats();

// Writes the ops the hook records from now on as a trace (trace_recorder.h) to `path`. FailedPrecondition when
// remat is not enabled or a trace is already being written. DisableRemat stops it too. `estimated_costs`: TIME is
// the engine's estimate (op_cost.h) instead of the measured time.
// `declared`: storages that exist now and hold budgeted memory (EngineBridge::HeldStorages): CONSTANTs at the
// trace's start, released when they die, so that a replay counts what the program keeps without touching.
// `counts`: whether a storage's bytes count against the budget (TraceRecorder::CountsAgainstBudget; null: all do).
absl::Status StartTrace(const std::string& path, bool estimated_costs = false,
                        const std::vector<c10::intrusive_ptr<c10::StorageImpl>>& declared = {},
                        TraceRecorder::CountsAgainstBudget counts = nullptr);
// Closes the trace; returns the number of ops written. FailedPrecondition when no trace is being written.
absl::StatusOr<std::uint64_t> StopTrace();
// OK, or why the trace being written lost lines (TraceRecorder::WriteStatus: a full disk). The recording goes on
// (and StopTrace or DisableRemat returns the same error) until it is stopped; the Python API raises it from
// remat.stats() and mark_step() (every optimizer step), so a lost trace stops the run within a step.
absl::Status TraceWriteStatus();

// Enables remat for its lifetime; throws c10::Error when EnableRemat fails.
class RematGuard {
 public:
  explicit RematGuard(const RematOptions& options);
  ~RematGuard();
  RematGuard(const RematGuard&) = delete;
  RematGuard& operator=(const RematGuard&) = delete;
};

}  // namespace remat::integration
