#include "tools/sim_planner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/byte_size.h"
#include "runtime/replay.h"
#include "tools/checkmate_planner.h"
#include "tools/plan_problem.h"
#include "tools/rotor_planner.h"
#include "tools/schedule_check.h"

namespace remat::sim {
namespace {

// "unet" from "unet-6-...-default.log", "lstm@0+150" for a segment of it.
std::string ShortTraceName(const std::string& trace) {
  const std::size_t at = trace.rfind('@');
  return absl::StrCat(trace.substr(0, trace.find('-')), at == std::string::npos ? "" : trace.substr(at));
}

// One plan, whatever the planner.
struct Plan {
  std::string status;  // plan::ToString, "not-chain" or "n/a"
  bool solved = false;
  double overhead = 0, lower_bound = 0, solve_s = 0, wall_s = 0;
  std::int64_t peak_bytes = 0, recomputations = 0, size = 0, stall_ns = 0, page_outs = 0, page_ins = 0;
  std::string size_unit, message, note;
};

Plan FromCheckmate(const plan::PlanOutcome& o) {
  Plan p;
  p.status = std::string(plan::ToString(o.status));
  p.solved = o.status == plan::PlanStatus::kOptimal || o.status == plan::PlanStatus::kFeasible;
  p.overhead = o.overhead;
  p.lower_bound = o.lower_bound_overhead;
  p.solve_s = o.solve_s;
  p.wall_s = o.wall_s;
  p.peak_bytes = o.peak_bytes;
  p.recomputations = o.recomputations;
  p.size = o.binaries;
  p.size_unit = "binaries";
  p.stall_ns = o.stall_ns;
  p.page_outs = o.page_outs;
  p.page_ins = o.page_ins;
  p.message = o.message;
  p.note = o.message.empty() ? absl::StrFormat("%s; lower bound %.4f; %d binaries; %d page-outs, %d page-ins",
                                               o.solver, o.lower_bound_overhead, o.binaries, o.page_outs, o.page_ins)
                             : o.message;
  return p;
}

Plan FromRotor(const plan::RotorOutcome& o) {
  Plan p;
  p.status = o.status == plan::PlanStatus::kTooBig ? "not-chain" : std::string(plan::ToString(o.status));
  p.solved = o.status == plan::PlanStatus::kOptimal || o.status == plan::PlanStatus::kFeasible;
  p.overhead = o.overhead;
  p.lower_bound = 0;  // the DP's optimum bounds Rotor's schedules only, not every schedule
  p.solve_s = p.wall_s = o.solve_s;
  p.peak_bytes = o.peak_bytes;
  p.recomputations = o.recomputations;
  p.size = o.stages;
  p.size_unit = "stages";
  p.message = p.solved ? "" : o.message;
  p.note = p.message.empty()
               ? absl::StrFormat("Rotor DP; %d stages (finest %d); units of %d bytes (%s); DP overhead %.4f", o.stages,
                                 o.finest_stages, o.unit_bytes, o.exact ? "exact" : "rounded up", o.dp_overhead)
               : o.message;
  return p;
}

}  // namespace

bool RunPlanners(const std::string& program, const SimOptions& options, const SimRunner& runner,
                 std::vector<SimRow>& rows, std::ostream& out, std::ostream& err) {
  plan::PlannerOptions ilp;
  ilp.time_limit_s = options.planner_time_limit_s;
  ilp.max_binaries = options.planner_max_binaries;
  ilp.link.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  ilp.link.latency_ns = options.link_latency_ns >= 0 ? options.link_latency_ns : ReplayOptions().link_latency_ns;
  ilp.link.duplex = options.duplex_link;
  ilp.link.host_budget = options.host_budget_bytes > 0 ? static_cast<std::int64_t>(options.host_budget_bytes)
                                                       : std::numeric_limits<std::int64_t>::max();
  const std::string default_policy = ReplayOptions().policy;
  std::vector<SimRow> planned;
  std::string table = absl::StrFormat("%-24s %6s %10s %-18s %10s %9s %9s %-10s %9s %9s %9s %9s %9s %9s\n", "trace",
                                      "ratio", "budget", "planner", "status", "optimum", "bound", "best",
                                      "best_ovh", default_policy, "gap_best", absl::StrCat("gap_", default_policy),
                                      "solve_s", "size");
  for (std::size_t t = 0; t < options.traces.size(); ++t) {
    const std::string name = TraceFileName(runner.trace(t).path);
    absl::StatusOr<plan::PlanProblem> problem = plan::BuildPlanProblem(runner.trace(t));
    if (!problem.ok()) {
      err << program << ": planner: " << problem.status().message() << "\n";
      return false;
    }
    absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(runner.trace(t));
    if (!replayer.ok()) {
      err << program << ": planner: " << replayer.status().message() << "\n";
      return false;
    }
    // One plan per distinct (budget, paging) among this trace's rows, in row order.
    std::vector<std::pair<std::int64_t, bool>> cases;
    for (const SimRow& row : rows) {
      const std::pair<std::int64_t, bool> c{row.budget_bytes, row.offload != "off"};
      if (row.trace == name && std::find(cases.begin(), cases.end(), c) == cases.end()) cases.push_back(c);
    }
    // Per budget, the cheapest drop-only schedule so far (policies', then plans'): the paging ILP's start.
    std::map<std::int64_t, std::pair<std::vector<std::int32_t>, std::int64_t>> drop_best;
    auto offer = [&](std::int64_t budget, const std::vector<std::int32_t>& schedule) {
      const plan::ScheduleVerdict verdict = plan::CheckSchedule(*problem, budget, schedule);
      auto it = drop_best.find(budget);
      if (verdict.valid && (it == drop_best.end() || verdict.total_ns < it->second.second)) {
        drop_best[budget] = {schedule, verdict.total_ns};
      }
    };
    for (const auto& [budget, paging] : cases) {
      err << program << ": planning " << name << " at " << budget << " bytes" << (paging ? " with paging" : "")
          << "...\n";
      // Every passing drop-only policy's schedule, checked offline; the cheapest is the ILP's start.
      ilp.start.clear();
      ilp.paging = paging;
      std::int64_t start_ns = 0;
      for (const SimRow& row : rows) {
        if (row.trace != name || row.budget_bytes != budget || row.result != "pass" || row.offload != "off" ||
            drop_best.count(budget) > 0) {
          continue;
        }
        SimJob job{t, row.policy, row.offload, row.ratio, row.budget_given ? static_cast<std::uint64_t>(budget) : 0};
        ReplayOptions replay = MakeReplayOptions(options, AccountingMode::kCounter, job);
        std::vector<std::int32_t> schedule;
        replay.schedule = &schedule;
        const ReplayResult rerun = (*replayer)->Run(replay);
        if (std::find(schedule.begin(), schedule.end(), -1) != schedule.end()) {
          err << program << ": planner: " << row.policy
              << "'s run brings back a released constant (no cost in the engine, not in the planner's model): "
                 "not used as a start\n";
          continue;
        }
        const plan::ScheduleVerdict verdict = plan::CheckSchedule(*problem, budget, schedule);
        if (rerun.status == ReplayStatus::kPass && verdict.released_constant_read) {
          // The engine keeps a released constant while a replay may read it (runtime/replay.h); the planners'
          // model does not (plan_problem.h). Not a start, and not an error.
          err << program << ": planner: " << row.policy << "'s run reads a constant after its release (allowed in "
              << "the engine, not in the planners' model): not used as a start\n";
          continue;
        }
        if (rerun.status != ReplayStatus::kPass || !verdict.valid || verdict.total_ns != rerun.total_compute_ns) {
          err << program << ": planner: " << row.policy << "'s schedule does not check: "
              << (verdict.valid ? absl::StrCat("op time ", verdict.total_ns, " against the engine's ",
                                               rerun.total_compute_ns)
                                : verdict.violation)
              << "\n";
          return false;
        }
        if (ilp.start.empty() || verdict.total_ns < start_ns) {
          ilp.start = schedule;
          start_ns = verdict.total_ns;
        }
      }
      if (!ilp.start.empty()) offer(budget, ilp.start);
      if (auto it = drop_best.find(budget); it != drop_best.end()) ilp.start = it->second.first;
      // The policies' rows at this budget and paging.
      const SimRow* best = nullptr;
      const SimRow* fallback = nullptr;
      for (const SimRow& row : rows) {
        if (row.trace != name || row.budget_bytes != budget || (row.offload != "off") != paging) continue;
        if (row.result == "pass" && (best == nullptr || row.overhead < best->overhead)) best = &row;
        if (row.policy == default_policy && fallback == nullptr) fallback = &row;
      }
      for (const std::string& planner : options.planners) {
        Plan plan;
        if (planner == "checkmate") {
          absl::StatusOr<plan::PlanOutcome> outcome = plan::PlanCheckmate(*problem, budget, ilp);
          if (!outcome.ok()) {
            err << program << ": planner: " << outcome.status().message() << "\n";
            return false;
          }
          plan = FromCheckmate(*outcome);
          if (!paging && plan.solved) {
            std::vector<std::int32_t> schedule;
            for (const plan::PlanStep& step : outcome->steps) schedule.push_back(step.index);
            offer(budget, schedule);
          }
        } else if (paging) {
          plan.status = "n/a";
          plan.message = plan.note =
              "rotor plans drop-only (its DP has no paging): the joint drop-or-page plan is --planner checkmate";
        } else {
          absl::StatusOr<plan::RotorOutcome> outcome = plan::PlanRotor(*problem, budget);
          if (!outcome.ok()) {
            err << program << ": planner: " << outcome.status().message() << "\n";
            return false;
          }
          plan = FromRotor(*outcome);
          if (plan.solved) offer(budget, outcome->schedule);
        }
        SimRow row = fallback != nullptr ? *fallback : (best != nullptr ? *best : SimRow{});
        row.trace = name;
        row.budget_bytes = budget;
        row.policy = absl::StrCat("opt-", planner, paging ? "+page" : "");
        row.result = plan.status;
        row.overhead = plan.overhead;
        row.peak_bytes = plan.peak_bytes;
        row.evictions = 0;
        row.rematerializations = plan.recomputations;
        row.transfer_stall_ns = plan.stall_ns;
        row.page_outs = plan.page_outs;
        row.page_ins = plan.page_ins;
        row.paged_out_bytes = row.paged_in_bytes = 0;
        row.replayed_cost_ns = plan.solved ? static_cast<std::int64_t>((plan.overhead - 1) *
                                                                       static_cast<double>(problem->compute_ns)) -
                                                 plan.stall_ns
                                           : 0;
        row.heuristic_evaluations = 0;
        row.search_time_ns = static_cast<std::int64_t>(plan.solve_s * 1e9);
        row.wall_time_ns = static_cast<std::int64_t>(plan.wall_s * 1e9);
        row.total_compute_ns = row.replayed_cost_ns + problem->compute_ns;
        row.message = plan.note;
        auto number = [](bool ok, double x) { return ok ? absl::StrFormat("%.4f", x) : std::string("-"); };
        auto gap = [&](const SimRow* policy) {
          if (!plan.solved || policy == nullptr || policy->result != "pass") return std::string("-");
          return absl::StrFormat("%+.1f%%", 100.0 * (policy->overhead / plan.overhead - 1.0));
        };
        const bool fallback_passed = fallback != nullptr && fallback->result == "pass";
        table += absl::StrFormat(
            "%-24s %6.2f %10s %-18s %10s %9s %9s %-10s %9s %9s %9s %9s %9.2f %9s\n", ShortTraceName(row.trace),
            row.ratio, FormatBytes(static_cast<std::uint64_t>(budget)), row.policy, row.result,
            number(plan.solved, plan.overhead), number(plan.lower_bound > 0, plan.lower_bound),
            best != nullptr ? best->policy : "-", number(best != nullptr, best != nullptr ? best->overhead : 0),
            fallback_passed ? absl::StrFormat("%.4f", fallback->overhead) : (fallback ? fallback->result : "-"),
            gap(best), gap(fallback), plan.solve_s, absl::StrCat(plan.size, " ", plan.size_unit));
        if (!plan.message.empty()) table += absl::StrCat("  ", plan.message, "\n");
        planned.push_back(std::move(row));
      }
    }
  }
  out << "\nOffline optimum (" << absl::StrJoin(options.planners, ", ")
      << "; verified schedules; gap = policy / optimum - 1):\n"
      << table << std::flush;
  rows.insert(rows.end(), planned.begin(), planned.end());
  return true;
}

}  // namespace remat::sim
