// Plan mode's planner (issue 21, DESIGN.md "Plan mode"): given a recorded iteration (a Trace) and the run's
// budget and configuration, finds the schedule later iterations should follow (runtime/plan_guide.h).
//
// Contract:
//   - Candidates: each drop-or-page policy of `PlanCandidates()` (the DTR family also with foresight: in a
//     recorded iteration the next use of every storage is known, runtime/trace_future.h) replays the iteration
//     under `base` (budget, accounting mode, paging, engine configuration; its policy is the online fallback) while a
//     PlanRecorder watches; each passing candidate's plan is then followed in a second replay with the fallback,
//     and the plan whose followed run costs least (overhead, then fewer plan fallbacks) is the answer, with
//     `overhead` that followed run's. Ties keep the earlier candidate: the choice is deterministic for a trace.
//   - NotFound (naming the best failure) when no candidate passes: the caller stays with the online policy.
//   - Pure function of its inputs; thread-safe for distinct Replayers (the PyTorch path runs it on a planner thread).
//   - RunPlanMode is remat-sim's row for policy "plan": plan on the trace, then follow the plan on the same trace
//     (the trace stands for both the recorded iteration and the next one); the result names the chosen schedule.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/plan_guide.h"
#include "runtime/replay.h"

namespace remat {

// A candidate schedule: a policy, with foresight or not.
struct PlanCandidate {
  std::string policy;
  bool foresight = false;
  std::string Name() const { return foresight ? policy + "+foresight" : policy; }
};

std::vector<PlanCandidate> PlanCandidates();

absl::StatusOr<IterationPlan> PlanIteration(Replayer& replayer, const ReplayOptions& base,
                                            const std::vector<PlanCandidate>& candidates = PlanCandidates());

// Policy "plan" in a replay (see the contract). `options.policy` is "plan"; the fallback is dtr-eq.
ReplayResult RunPlanMode(Replayer& replayer, const ReplayOptions& options);

}  // namespace remat
