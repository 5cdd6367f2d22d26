// SimRunner: turns parsed SimOptions into replay jobs and runs them in parallel through runtime/replay.h.
//
// Contract:
//   - PlanJobs makes one job per (trace, policy, offload mode, ratio or budget), trace-major, then policy, then
//     offload mode, then ratio/budget, in the order given on the command line; the rows come back in that
//     order whatever the execution order.
//   - Prepare reads every trace (ReadTrace: errors name file:line and reason; with --segment, the window of it,
//     tools/trace_segment.h) and prepares one Replayer per
//     trace (which computes its baseline); the first failure is returned and nothing runs.
//   - Run executes the jobs on `threads` worker threads (0: one per core, never more than the jobs). A Replayer
//     is not thread-safe (replay.h), so each worker takes a Replayer of the job's trace from a per-trace free
//     list and gives it back afterwards, creating another only when all of that trace's replayers are busy: a
//     trace's baseline is computed once per replayer, at most min(threads, jobs of that trace) times, usually
//     once. Traces are shared read-only.
//   - `on_done` (may be empty) is called after each job, serialized under a lock, with the finished row and the
//     number of rows finished so far.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/replay.h"
#include "runtime/trace.h"
#include "tools/result_table.h"
#include "tools/sim_options.h"

namespace remat::sim {

struct SimJob {
  std::size_t trace = 0;       // index into SimOptions::traces
  std::string policy;
  std::string offload = "off";  // an offload mode name (runtime/config.h)
  double ratio = 0;            // used when budget_bytes == 0
  std::uint64_t budget_bytes = 0;
};

std::vector<SimJob> PlanJobs(const SimOptions& options);

// The engine's options for one job (mode already parsed from SimOptions::mode).
ReplayOptions MakeReplayOptions(const SimOptions& options, AccountingMode mode, const SimJob& job);

// One output row from a job and its result.
// `mode_name`: the row's mode as the user named it ("stitch" runs in arena mode); empty: ToString(mode).
SimRow MakeRow(const std::string& trace_path, AccountingMode mode, const SimJob& job, const ReplayResult& result,
               std::string_view mode_name = {});

// remat-sim's --mode for arena mode over a stitching arena (issue 18).
inline constexpr std::string_view kStitchMode = "stitch";

class SimRunner {
 public:
  // Reads and prepares the traces named in `options`. Fails with the first trace's error.
  static absl::StatusOr<std::unique_ptr<SimRunner>> Prepare(const SimOptions& options);
  ~SimRunner();

  using OnDone = std::function<void(const SimRow& row, std::size_t done, std::size_t total)>;
  // `timeline`, when set, is filled with the samples of the run (ReplayOptions::timeline); `jobs` must then hold
  // one job.
  std::vector<SimRow> Run(const std::vector<SimJob>& jobs, int threads, const OnDone& on_done,
                          std::vector<TimelineSample>* timeline = nullptr);

  const Baseline& baseline(std::size_t trace) const;
  const Trace& trace(std::size_t trace) const;  // as replayed: the --segment window when one was asked for

 private:
  struct State;
  explicit SimRunner(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Worker threads to use for `jobs` jobs when the user asked for `requested` (0: one per core).
int ThreadCount(int requested, std::size_t jobs);

}  // namespace remat::sim
