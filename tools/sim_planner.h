// SimPlanner: remat-sim's offline references (--planner): plans each (trace, budget, paging or not) of the policies'
// rows with every planner asked for, appends one row per plan (policy "opt-<planner>", "opt-checkmate+page" for
// the joint drop-or-page plan; result = the plan's status) and prints a table comparing each plan with the best and
// the default policy at the same budget and paging.
//
// Contract:
//   - Planners: `checkmate` (tools/checkmate_planner.h; with paging, its drop-or-page ILP under the link of
//     --bandwidth, --link-latency, --duplex-link and --host-budget) and `rotor` (tools/rotor_planner.h; drop-only:
//     for rows with paging it says so, status "n/a"; a trace that is not a chain gets status "not-chain" and the
//     reason). Rows with --offload off are drop-only plans, rows with any other mode share one paging plan.
//   - Every passing drop-only policy run is first checked offline from its schedule (ReplayOptions::schedule): the
//     checker must find it valid at the engine's op time (else the run stops: a bug in one of the two), and the
//     cheapest is the ILP's start. Runs that bring back or read a released constant (the engine allows it, the
//     planners' model does not) are skipped as starts, with a note. The paging ILP starts from the cheapest
//     drop-only schedule of the same budget, the drop-only plans included (a drop-only schedule is a paging
//     schedule that pages nothing), so with --offload off,... its plan is never worse than any drop-only one.
//   - Gaps compare a plan with the policies' rows of the same budget and paging: gap = policy / plan - 1.
//   - Returns false (after printing why on `err`) when a planner cannot run at all.
#pragma once

#include <ostream>
#include <vector>

#include "tools/result_table.h"
#include "tools/sim_options.h"
#include "tools/sim_runner.h"

namespace remat::sim {

bool RunPlanners(const std::string& program, const SimOptions& options, const SimRunner& runner,
                 std::vector<SimRow>& rows, std::ostream& out, std::ostream& err);

}  // namespace remat::sim
