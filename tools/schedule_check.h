// ScheduleCheck: replays an offline schedule (a sequence of op executions) over a PlanProblem under a byte budget
// and says whether it is valid and what it costs, counting bytes as remat-sim's counter mode counts them.
//
// Contract:
//   - A schedule lists op indices in execution order. Every op appears once at its place (its original execution:
//     the originals in index order, op k being the k-th); any other appearance is a recomputation, allowed only for
//     a recomputable op (PlanOp::recomputable) whose original has run. An execution between originals k-1 and k is
//     in stage k; after the last original, in the end stage (ops.size()).
//   - An execution is valid only if every value it reads is resident (made earlier and not yet freed or consumed
//     in place) and every constant it reads is in memory in its stage (PlanProblem's contract).
//   - Bytes in use = constants in memory in the stage + resident values. Before an execution, in use + the bytes
//     of all its fresh outputs must be <= budget (remat-sim: while used + outputs > budget, evict; an in-place
//     output adds no bytes). Evictions cost nothing and the checker makes the best ones: a value is freed right
//     after the execution that touches it last before it is made again, is consumed in place, or the schedule ends
//     (final outputs are kept to the end). Freeing is the only eviction rule, so the verdict depends on the
//     schedule alone.
//   - In-place writes: the original execution consumes the value it writes (its bytes become the new value's, no
//     bytes added); a recomputation writes a new copy, as the engine replays it (the new value's bytes are added and
//     the old value stays until it is freed as any other).
//   - At the end every final output must be resident.
//   - Paging (CheckSteps with `paging`): a schedule may also page a value out to the second tier and back in, with the
//     engine's link model (runtime/link_model.h, runtime/engine.h's contract): a page-out needs the value resident,
//     releases its device bytes at once and keeps a host copy (within `paging.host_budget`); its copy occupies the
//     link from its issue (never delaying an op). A page-in needs a host copy of a value that is not resident and
//     has not been consumed in place since, allocates its bytes at once (in use + its bytes <= budget, as an
//     op's outputs) and drops the host copy; an op that reads a paged-in value starts no earlier than that copy
//     ends (stall, which advances the clock). A value made again by a recomputation drops its host copy. The
//     freeing rule above counts a page-out as a read (the value stays until it) and a page-in as a making.
//   - The result carries the first violation (position in the schedule, op, trace line, reason) or, when valid,
//     the total op time (originals + recomputations: remat-sim's clock advance), the recomputation count and cost,
//     and the peak of (in use + outputs) over the executions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "tools/plan_problem.h"

namespace remat::plan {

struct ScheduleVerdict {
  bool valid = false;
  std::string violation;        // empty when valid
  bool released_constant_read = false;  // the violation: a constant read after its release (the engine allows it)
  std::int64_t total_ns = 0;    // op time, recomputations included
  std::int64_t recompute_ns = 0;
  std::int64_t recomputations = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t stall_ns = 0;    // paging: clock time ops waited for page-ins
  std::int64_t page_outs = 0;
  std::int64_t page_ins = 0;
  std::int64_t host_peak_bytes = 0;
  double overhead = 0;          // (total_ns + stall_ns) / problem.compute_ns
};

// One step of a paged schedule: run op `index`, or page value `index` out or in.
enum class StepKind : std::uint8_t { kRun, kPageOut, kPageIn };
struct PlanStep {
  StepKind kind = StepKind::kRun;
  std::int32_t index = 0;
  bool operator==(const PlanStep& o) const { return kind == o.kind && index == o.index; }
};

ScheduleVerdict CheckSchedule(const PlanProblem& problem, std::int64_t budget, const std::vector<std::int32_t>& schedule);

// A schedule of steps; with `paging` (not owned; its mode is ignored: the steps say what moves) page steps follow
// its link model, without it they are violations (CheckSchedule is CheckSteps without paging).
ScheduleVerdict CheckSteps(const PlanProblem& problem, std::int64_t budget, const PagingOptions* paging,
                           const std::vector<PlanStep>& steps);

// The schedule with no recomputation: every op once, in order.
std::vector<std::int32_t> OriginalOrder(const PlanProblem& problem);

}  // namespace remat::plan
