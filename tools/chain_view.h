// ChainView: a PlanProblem seen as a heterogeneous chain (Beaumont, Herrmann, Shilova et al., "Optimal
// checkpointing for heterogeneous chains"): forward stages F_0..F_{L-1} run in order, then backward stages
// B_{L-1}..B_0, each stage a run of consecutive ops, so that Rotor's dynamic program (tools/rotor_planner.h) applies.
//
// Contract:
//   - Ops [0, turn) are the forward, [turn, ops) the backward. Forward stage l is ops [fwd_begin, fwd_end), backward
//     stage l is ops [bwd_begin, bwd_end) (possibly empty); the forward stages tile [0, turn) in order, the backward
//     stages tile [turn, ops) in reverse stage order (B_{L-1} first).
//   - The chain rules, which every op satisfies: a forward op of stage l reads values of F_l and F_{l-1} only (and
//     constants), and writes in place only values of F_l; a backward op of stage l reads forward values of F_l and
//     F_{l-1} only, writes in place forward values of F_l only, and reads any value made earlier in the backward.
//     A forward value is `pinned` when it is a final output, or made by an op that reads a constant released before
//     the last op (a recomputation in the backward could come after the release): it stays from its
//     making until its last read, constrains no stage and belongs to no x or tape (the DP counts it as resident
//     throughout), and an op that makes only pinned values is never recomputed (`rerun` false, as for ops that make
//     no value). So the constants a `rerun` op reads stay to the end.
//   - x[l] (X_l, "x^l"): the values of F_l read by an op outside F_l and B_l (so by F_{l+1} or B_{l+1}). tape[l]
//     ("x-bar^l"): the values of F_l that B_l reads, and X_l. reads_input[l]: B_l reads a value of X_{l-1}.
//     carried[l]: the values made in the backward before B_l begins that an op of B_l or later reads or that are
//     outputs (what is resident, whatever the schedule, when B_l begins; a backward op is never recomputed).
//   - FindChain tries every turn and, for each, starts from one stage per forward op and merges neighbouring stages
//     until the rules hold; it keeps the turn with the most stages (ties: the earliest). A view needs at least 2
//     stages; otherwise the answer is FailedPrecondition "not a chain: ..." saying why (for the turn that came
//     closest). Problems of more than `max_ops` ops are refused the same way (the search is quadratic in ops),
//     advising --segment. (Most traces of a few ops can be seen as 2 stages, the first op and the rest: the number
//     of stages found says how chain-like a trace is; 2 is barely.)
//   - With more than `max_stages` stages (the DP's cost grows as stages^3), neighbouring stages are merged, the pair
//     of least forward time first, until `max_stages` remain (merging neighbours keeps the rules);
//     `finest_stages` says how many there were.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/plan_problem.h"

namespace remat::plan {

struct ChainStage {
  std::int32_t fwd_begin = 0, fwd_end = 0;
  std::int32_t bwd_begin = 0, bwd_end = 0;
  std::vector<std::int32_t> x, tape, carried;  // value indices (see the contract)
  bool reads_input = false;
};

struct ChainView {
  std::int32_t turn = 0;
  std::vector<ChainStage> stages;      // stage 0 first
  std::vector<std::int32_t> op_stage;  // each op's stage
  std::int32_t finest_stages = 0;      // before merging down to max_stages
  std::vector<std::int32_t> pinned;    // forward values that are final outputs
  std::vector<bool> rerun;             // a recomputation of its stage runs the op: it makes an unpinned value
};

absl::StatusOr<ChainView> FindChain(const PlanProblem& problem, std::int32_t max_ops = 1500,
                                    std::int32_t max_stages = 1 << 30);

}  // namespace remat::plan
