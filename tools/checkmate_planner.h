// CheckmatePlanner: the offline optimum of a PlanProblem under a byte budget, from a Checkmate-style ILP
// (tools/checkmate_ilp.py, solved by HiGHS), verified by replaying its schedule (tools/schedule_check.h).
//
// Contract:
//   - Why a Python helper: HiGHS comes from PyPI (highspy, scripts/setup.sh installs it into the venv) and has no
//     Debian package here; CBC (Debian) is the alternative but is much slower on these models. The problem goes to
//     the helper as JSON in a temporary directory, the schedule comes back as JSON; the interpreter is found as for
//     plots (tools/plot_launcher.h FindPython: $REMAT_PYTHON, $REMAT_VENV, ~/.cache/remat/venv, python3) and the
//     script is $REMAT_CHECKMATE_SCRIPT or this source tree's tools/checkmate_ilp.py. The solver uses one thread.
//   - Before building anything, the model's binaries are counted (R: op i recomputed in stage t; S: value v kept
//     into stage t); above `max_binaries` the answer is status kTooBig with a message that says how many and
//     suggests --segment, instead of a solve that would not end.
//   - The solver stops at `time_limit_s` (its own clock; building the model in Python comes on top). Statuses:
//     kOptimal (proved within mip_rel_gap 1e-4), kFeasible (time limit, best schedule found), kInfeasible (proved:
//     no schedule fits the budget under the ILP's memory model), kUnsolved (time limit without any schedule),
//     kTooBig. `lower_bound_overhead` is the solver's dual bound / compute (0 when it has none); it bounds the ILP's
//     optimum, which counts memory at least as strictly as the checker, so it is a lower bound for schedules of the
//     ILP's form (recomputations grouped before each op, in index order).
//   - Every schedule the solver returns is checked; `overhead` is the checker's (op time of the schedule / compute)
//     and a schedule the checker rejects is an Internal error naming the violation (a bug in the ILP, never a
//     result).
//   - Paging (`paging` set): the joint drop-or-page plan. The ILP gets page-out, page-in and host-copy binaries per
//     value and stage and pays every copy's link time (runtime/link_model.h TransferNs with paging's bandwidth and
//     latency; checkmate_ilp.py says why that sum bounds the stall). Its steps are checked by CheckSteps with paging
//     (tools/schedule_check.h) with the engine's link model, overlap included, and `overhead` is the checker's
//     (op time + stall) / compute; the solver's bound is then a bound of the ILP's upper-bound cost, not of the
//     schedule's, so `lower_bound_overhead` is 0 (none: only the compute itself bounds it), and kOptimal means
//     optimal for the ILP's cost (copies on the critical path), the checker's cost being at most that. Constants are never
//     paged. Drop-only schedules are part of the model, so with the same start it is never worse than drop-only.
//   - Errors: FailedPrecondition when the helper cannot run or highspy is missing (saying how to install it),
//     Internal when it fails otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine.h"
#include "tools/plan_problem.h"
#include "tools/schedule_check.h"

namespace remat::plan {

enum class PlanStatus { kOptimal, kFeasible, kInfeasible, kUnsolved, kTooBig };
std::string_view ToString(PlanStatus status);  // "optimal", "feasible", "infeasible", "unsolved", "too-big"

struct PlannerOptions {
  double time_limit_s = 300;
  std::int64_t max_binaries = 400'000;
  std::string python;   // empty: FindPython()
  std::string script;   // empty: $REMAT_CHECKMATE_SCRIPT or the source tree's tools/checkmate_ilp.py
  bool verbose = false; // the solver's log on stderr (also when $REMAT_PLANNER_VERBOSE is set and not "0")
  // A valid schedule to start from (e.g. a policy's, ReplayOptions::schedule), or empty. The solver gets it in the
  // ILP's form (each stage's recomputations in index order, once each) as its first incumbent when that form fits
  // the ILP's memory model; whatever happens, the outcome is never worse than it: when the solver ends with
  // nothing better (or nothing), the start itself is the answer (status kFeasible, or kOptimal if the bound meets it).
  std::vector<std::int32_t> start;
  bool paging = false;            // plan page-outs and page-ins too, with `link` (bandwidth, latency, duplex, host)
  PagingOptions link;
};

struct PlanOutcome {
  PlanStatus status = PlanStatus::kUnsolved;
  double overhead = 0;               // verified; kOptimal and kFeasible only
  double lower_bound_overhead = 0;   // 0: none
  double solve_s = 0;                // solver time (model building excluded)
  double wall_s = 0;                 // the whole call
  std::int64_t peak_bytes = 0;
  std::int64_t recomputations = 0;
  std::int64_t binaries = 0;
  std::string solver;
  std::string message;               // kTooBig, kUnsolved: why
  bool start_accepted = false;       // options.start was given to the solver (HiGHS uses it if it fits its model)
  bool from_start = false;           // the answer is options.start itself (the solver found nothing better)
  std::vector<PlanStep> steps;       // the verified schedule (kOptimal, kFeasible)
  std::int64_t stall_ns = 0;         // paging: the checker's stall
  std::int64_t page_outs = 0, page_ins = 0;
};

// Binaries the ILP would have (see the contract); with paging, an upper bound (the helper prunes some).
std::int64_t CountBinaries(const PlanProblem& problem, bool paging = false);

absl::StatusOr<PlanOutcome> PlanCheckmate(const PlanProblem& problem, std::int64_t budget,
                                          const PlannerOptions& options);

}  // namespace remat::plan
