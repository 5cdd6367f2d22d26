// RotorPlanner: the optimum of a chain-shaped PlanProblem under a byte budget from Rotor's dynamic program
// (Beaumont, Herrmann, Shilova et al., "Optimal checkpointing for heterogeneous chains"), over the stages of its
// ChainView (tools/chain_view.h), verified by replaying its schedule (tools/schedule_check.h).
//
// Contract:
//   - The DP: C(s, t, m) is the least forward time that runs B_t..B_s when x^{s-1} and the backward's carried
//     values are resident and m bytes are free for the rest. Its choices are Rotor's: run F_s keeping its tape
//     ("F_all"), then C(s+1, t) and B_s; or run F_s..F_{s'-1} keeping only x^{s'-1} (a checkpoint, "F_ck" then
//     "F_no"), then C(s', t), then C(s, s'-1). Backward ops run once; forward stages are recomputed whole (ops that
//     make no value, such as views, or only pinned outputs, run at their place only). Two refinements over Rotor, so that it reaches the
//     checker's optimum on chains: a state says whether x^{s-1} is the subproblem's own (a checkpoint it may free
//     once nothing in it reads x^{s-1}, as the checker does) or its caller's; and when a stage's tape is its x (F_all
//     keeps nothing more than F_no), a checkpoint of it may stay for its backward instead of F_l running again (and
//     after the first forward pass, a backward that reads nothing of its own forward does not run it again).
//   - Memory is the checker's, stage by stage: each stage's peak (in use plus outputs before each op, values freed
//     after their last read in the stage, original and recomputed runs alike, the larger of the two) is measured by
//     running the stage's ops alone; the constants count at their largest over the trace, and pinned forward outputs
//     (tools/chain_view.h) as resident throughout. Where the checker frees
//     earlier than the DP assumes (a tape value no longer read, constants released), the DP is conservative: its
//     schedule always fits, and the checker's verdict is what is reported.
//   - Bytes are counted in units: the greatest common divisor of every size the DP uses when the budget holds at
//     most `max_slots` of them (exact), else budget / max_slots rounded up, every size rounded up and the budget
//     down (conservative, `exact` false). The table has stages^2 x slots x 4 entries; above 8 M, slots shrink.
//     Chains of more than `max_stages` stages are merged down to it first (tools/chain_view.h).
//   - Outside the DP's form (so where the ILP can do better): a checkpoint x^{s-1} that B_s reads stays from F_s's
//     last run to B_s, whereas a schedule may drop it and rebuild it from an earlier one in between (measured on a
//     chain whose backward reads its forward input: 9 ns of recomputation for the ILP, 10 for the DP).
//   - Statuses: kOptimal (the optimum among Rotor's schedules of the finest stages: exact units, no merging),
//     kFeasible (a schedule of Rotor's form from merged stages or rounded units: not proved optimal), kInfeasible
//     (no schedule of the DP's form fits; not a proof that none does), kTooBig (not a chain, or too many ops: the
//     message says why, from FindChain).
//   - Every schedule is checked; `overhead` is the checker's, and a schedule the checker rejects is an Internal error
//     naming the violation (a bug, never a result).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/checkmate_planner.h"
#include "tools/plan_problem.h"

namespace remat::plan {

struct RotorOptions {
  std::int64_t max_slots = 2000;
  std::int32_t max_stages = 64;   // FindChain merges neighbouring stages down to this many
  std::int32_t max_ops = 1500;    // FindChain refuses larger problems
};

struct RotorOutcome {
  PlanStatus status = PlanStatus::kTooBig;
  double overhead = 0;             // verified (kOptimal)
  double dp_overhead = 0;          // the DP's own figure (>= the checker's)
  std::int32_t stages = 0;         // the DP's stages
  std::int32_t finest_stages = 0;  // the chain's, before merging down to max_stages
  std::int64_t unit_bytes = 0;
  bool exact = false;
  double solve_s = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t recomputations = 0;
  std::vector<std::int32_t> schedule;
  std::string message;             // kTooBig: why not a chain; kInfeasible: what the DP could not fit
};

absl::StatusOr<RotorOutcome> PlanRotor(const PlanProblem& problem, std::int64_t budget,
                                       const RotorOptions& options = {});

}  // namespace remat::plan
