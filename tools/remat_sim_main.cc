// remat-sim: replays operator traces through the remat engine under memory budgets and eviction policies.
// Usage and flags: tools/sim_options.h (or `remat-sim --help`).
//
// Exit status: 0 every simulation ran (pass, oom and thrash are results), 2 command-line error (unknown flag,
// policy or mode, malformed list, missing trace file), 1 unreadable or malformed trace, or an output that could
// not be written.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "policies/registry.h"
#include "runtime/byte_size.h"
#include "runtime/replay.h"
#include "tools/checkmate_planner.h"
#include "tools/plan_problem.h"
#include "tools/schedule_check.h"
#include "tools/plot_launcher.h"
#include "tools/timeline_writer.h"
#include "tools/progress_bar.h"
#include "tools/result_table.h"
#include "tools/sim_options.h"
#include "tools/sim_runner.h"

namespace remat::sim {
namespace {

constexpr int kFailureExitCode = 1;

Vocabulary EngineVocabulary() {
  Vocabulary vocabulary;
  for (const auto& name : PolicyNames()) vocabulary.policies.emplace_back(name);
  vocabulary.modes = {std::string(ToString(AccountingMode::kCounter)), std::string(ToString(AccountingMode::kArena)),
                      "stitch"};
  vocabulary.default_policy = ReplayOptions().policy;
  vocabulary.default_mode = std::string(ToString(ReplayOptions().mode));
  vocabulary.planners = {"checkmate"};
  return vocabulary;
}

int UsageError(const std::string& program, absl::string_view message) {
  std::cerr << program << ": " << message << "\n"
            << "usage: " << program << " TRACE... [--ratios R,...|--budgets SIZE,...] [--policies P,...] "
            << "[--mode counter|arena|stitch] [--granule SIZE] [--offload off|auto|always,...] [--bandwidth RATE] [--out FILE.csv|.json] "
            << "[--plot FILE.png] (--help for more)\n";
  return kUsageExitCode;
}

// "resnet32 dtr-eq 0.5 pass" for the progress line.
std::string ProgressLabel(const SimRow& row) {
  const std::string budget = row.budget_given
                                 ? FormatBytes(static_cast<std::uint64_t>(row.budget_bytes))
                                 : absl::StrFormat("%.2f", row.ratio);
  return absl::StrCat(row.trace.substr(0, row.trace.find('-')), " ", row.policy,
                      row.offload == "off" ? "" : absl::StrCat(" offload=", row.offload), " ", budget, " ",
                      row.result);
}

bool WriteRows(const std::vector<SimRow>& rows, const std::string& path, OutFormat format, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    *error = absl::StrCat("cannot open '", path, "' for writing");
    return false;
  }
  if (format == OutFormat::kJson) {
    WriteJson(rows, out);
  } else {
    WriteCsv(rows, out);
  }
  out.close();
  if (!out) {
    *error = absl::StrCat("failed writing '", path, "'");
    return false;
  }
  return true;
}

// Writes the run's timeline: `path` itself when it is .json, else the JSON next to the .png and the plot of it.
absl::Status DrawTimeline(const std::vector<TimelineSample>& timeline, const SimRow& row, const std::string& path) {
  const std::string title = absl::StrCat(std::filesystem::path(row.trace).filename().string(), ", ", row.policy,
                                         ", ", row.mode, " mode, budget ", row.budget_bytes, " bytes: ", row.result);
  const bool png = absl::EndsWith(path, ".png");
  const std::string json = png ? absl::StrCat(path.substr(0, path.size() - 4), ".json") : path;
  if (absl::Status written = WriteTimeline(timeline, title, json); !written.ok()) return written;
  if (!png) return absl::OkStatus();
  return RunPythonScript(FindPython(), {TimelineScriptPath(), json, path, "--title", title});
}

// "unet" from "unet-6-...-default.log", "lstm@0+150" for a segment of it.
std::string ShortTraceName(const std::string& trace) {
  const std::size_t at = trace.rfind('@');
  return absl::StrCat(trace.substr(0, trace.find('-')), at == std::string::npos ? "" : trace.substr(at));
}

// --planner: the offline optimum of each (trace, budget) of the policies' rows, appended to `rows` (policy
// "opt-<planner>", result = the planner's status), and a table comparing it with the best and the default policy.
// Returns false (after printing why) when the planner could not run at all.
bool RunPlanner(const std::string& program, const SimOptions& options, const SimRunner& runner,
                std::vector<SimRow>& rows, std::ostream& out) {
  plan::PlannerOptions planner_options;
  planner_options.time_limit_s = options.planner_time_limit_s;
  planner_options.max_binaries = options.planner_max_binaries;
  const std::string default_policy = ReplayOptions().policy;
  std::vector<SimRow> planned;
  std::string table = absl::StrFormat("%-28s %6s %10s %10s %9s %9s %-10s %9s %9s %9s %9s %9s %9s\n", "trace",
                                      "ratio", "budget", "status", "optimum", "bound", "best", "best_ovh",
                                      default_policy, "gap_best", absl::StrCat("gap_", default_policy), "solve_s",
                                      "binaries");
  for (std::size_t t = 0; t < options.traces.size(); ++t) {
    absl::StatusOr<plan::PlanProblem> problem = plan::BuildPlanProblem(runner.trace(t));
    if (!problem.ok()) {
      std::cerr << program << ": planner: " << problem.status().message() << "\n";
      return false;
    }
    absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(runner.trace(t));
    if (!replayer.ok()) {
      std::cerr << program << ": planner: " << replayer.status().message() << "\n";
      return false;
    }
    // One plan per distinct budget among this trace's rows, in row order.
    std::vector<std::int64_t> budgets;
    for (const SimRow& row : rows) {
      if (row.trace != TraceFileName(runner.trace(t).path)) continue;
      if (std::find(budgets.begin(), budgets.end(), row.budget_bytes) == budgets.end()) {
        budgets.push_back(row.budget_bytes);
      }
    }
    for (std::int64_t budget : budgets) {
      std::cerr << program << ": planning " << TraceFileName(runner.trace(t).path) << " at " << budget
                << " bytes...\n";
      // Every passing policy's schedule, checked offline: the checker must find it valid at the same cost (the
      // engine and the checker count alike); the cheapest is the solver's start.
      planner_options.start.clear();
      std::int64_t start_ns = 0;
      for (const SimRow& row : rows) {
        if (row.trace != TraceFileName(runner.trace(t).path) || row.budget_bytes != budget || row.result != "pass") {
          continue;
        }
        SimJob job{t, row.policy, row.offload, row.ratio, row.budget_given ? static_cast<std::uint64_t>(budget) : 0};
        ReplayOptions replay = MakeReplayOptions(options, AccountingMode::kCounter, job);
        std::vector<std::int32_t> schedule;
        replay.schedule = &schedule;
        const ReplayResult rerun = (*replayer)->Run(replay);
        if (std::find(schedule.begin(), schedule.end(), -1) != schedule.end()) {
          // The engine replayed an op the trace did not make: a released constant it brought back at no cost,
          // which the planner's model does not allow (plan_problem.h). Not a start, and not an error.
          std::cerr << program << ": planner: " << row.policy
                    << "'s run brings back a released constant (no cost in the engine, not in the planner's model): "
                       "not used as a start\n";
          continue;
        }
        const plan::ScheduleVerdict verdict = plan::CheckSchedule(*problem, budget, schedule);
        if (rerun.status != ReplayStatus::kPass || !verdict.valid || verdict.total_ns != rerun.total_compute_ns) {
          std::cerr << program << ": planner: " << row.policy << "'s schedule does not check: "
                    << (verdict.valid ? absl::StrCat("op time ", verdict.total_ns, " against the engine's ",
                                                     rerun.total_compute_ns)
                                      : verdict.violation)
                    << "\n";
          if (std::getenv("REMAT_PLANNER_VERBOSE") != nullptr) {
            std::cerr << "schedule:";
            for (std::int32_t k : schedule) std::cerr << " " << k;
            std::cerr << "\n";
          }
          return false;
        }
        if (planner_options.start.empty() || verdict.total_ns < start_ns) {
          planner_options.start = schedule;
          start_ns = verdict.total_ns;
        }
      }
      absl::StatusOr<plan::PlanOutcome> outcome = plan::PlanCheckmate(*problem, budget, planner_options);
      if (!outcome.ok()) {
        std::cerr << program << ": planner: " << outcome.status().message() << "\n";
        return false;
      }
      // The policies' rows at this budget.
      const SimRow* best = nullptr;
      const SimRow* fallback = nullptr;
      for (const SimRow& row : rows) {
        if (row.trace != TraceFileName(runner.trace(t).path) || row.budget_bytes != budget) continue;
        if (row.result == "pass" && (best == nullptr || row.overhead < best->overhead)) best = &row;
        if (row.policy == default_policy) fallback = &row;
      }
      SimRow row = fallback != nullptr ? *fallback : (best != nullptr ? *best : SimRow{});
      row.policy = absl::StrCat("opt-", options.planner);
      row.result = std::string(plan::ToString(outcome->status));
      row.overhead = outcome->overhead;
      row.peak_bytes = outcome->peak_bytes;
      row.evictions = 0;
      row.rematerializations = outcome->recomputations;
      row.replayed_cost_ns = outcome->overhead > 0
                                 ? static_cast<std::int64_t>((outcome->overhead - 1) *
                                                             static_cast<double>(problem->compute_ns))
                                 : 0;
      row.heuristic_evaluations = 0;
      row.search_time_ns = static_cast<std::int64_t>(outcome->solve_s * 1e9);
      row.wall_time_ns = static_cast<std::int64_t>(outcome->wall_s * 1e9);
      row.total_compute_ns = row.replayed_cost_ns + problem->compute_ns;
      row.message = outcome->message.empty()
                        ? absl::StrFormat("%s; lower bound %.4f; %d binaries", outcome->solver,
                                          outcome->lower_bound_overhead, outcome->binaries)
                        : outcome->message;
      const bool solved = outcome->status == plan::PlanStatus::kOptimal ||
                          outcome->status == plan::PlanStatus::kFeasible;
      auto number = [](bool ok, double x) { return ok ? absl::StrFormat("%.4f", x) : std::string("-"); };
      auto gap = [&](const SimRow* policy) {
        if (!solved || policy == nullptr || policy->result != "pass") return std::string("-");
        return absl::StrFormat("%+.1f%%", 100.0 * (policy->overhead / outcome->overhead - 1.0));
      };
      const bool fallback_passed = fallback != nullptr && fallback->result == "pass";
      table += absl::StrFormat(
          "%-28s %6.2f %10s %10s %9s %9s %-10s %9s %9s %9s %9s %9.1f %9d\n", ShortTraceName(row.trace), row.ratio,
          FormatBytes(static_cast<std::uint64_t>(budget)), row.result, number(solved, outcome->overhead),
          number(outcome->lower_bound_overhead > 0, outcome->lower_bound_overhead),
          best != nullptr ? best->policy : "-", number(best != nullptr, best != nullptr ? best->overhead : 0),
          fallback_passed ? absl::StrFormat("%.4f", fallback->overhead) : (fallback ? fallback->result : "-"),
          gap(best), gap(fallback), outcome->solve_s, outcome->binaries);
      if (!outcome->message.empty()) table += absl::StrCat("  ", outcome->message, "\n");
      planned.push_back(std::move(row));
    }
  }
  out << "\nOffline optimum (" << options.planner << "; verified schedules; gap = policy / optimum - 1):\n"
      << table << std::flush;
  rows.insert(rows.end(), planned.begin(), planned.end());
  return true;
}

int Main(int argc, char** argv) {
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  const Vocabulary vocabulary = EngineVocabulary();
  absl::StatusOr<SimOptions> parsed = ParseSimOptions(std::vector<std::string>(argv + 1, argv + argc), vocabulary);
  if (!parsed.ok()) return UsageError(program, parsed.status().message());
  const SimOptions& options = *parsed;
  if (options.help) {
    std::cout << UsageText(program, vocabulary);
    return 0;
  }
  if (!options.planner.empty() && (options.dtr_paper || options.mode != "counter" ||
                                   options.offload != std::vector<std::string>{"off"})) {
    return UsageError(program, "--planner plans for counter mode, the product's engine configuration and no paging: "
                               "drop --mode arena, --dtr-paper and --offload");
  }
  for (const std::string& trace : options.traces) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(trace, error)) {
      return UsageError(program, absl::StrCat("trace file '", trace, "' not found (or not a regular file)"));
    }
  }

  absl::StatusOr<std::unique_ptr<SimRunner>> runner = SimRunner::Prepare(options);
  if (!runner.ok()) {
    std::cerr << program << ": " << runner.status().message() << "\n";
    return kFailureExitCode;
  }

  const std::vector<SimJob> jobs = PlanJobs(options);
  if (!options.timeline.empty() && jobs.size() != 1) {
    return UsageError(program, absl::StrCat("--timeline draws one run: give one trace, one policy, one offload mode "
                                            "and one ratio or budget (this command line plans ",
                                            jobs.size(), " runs)"));
  }
  std::vector<TimelineSample> timeline;
  ProgressBar progress = ProgressBar::ForStderr();
  std::vector<SimRow> rows = (*runner)->Run(
      jobs, options.jobs,
      [&](const SimRow& row, std::size_t done, std::size_t total) { progress.Update(done, total, ProgressLabel(row)); },
      options.timeline.empty() ? nullptr : &timeline);
  progress.Finish();

  std::cout << FormatTable(rows) << std::flush;
  if (!std::cout) {  // a full disk or a closed pipe: the table is lost, and the run must say so
    std::cerr << program << ": cannot write the table to standard output: " << std::strerror(errno) << "\n";
    return kFailureExitCode;
  }
  if (!options.planner.empty() && !RunPlanner(program, options, **runner, rows, std::cout)) return kFailureExitCode;
  int status = 0;
  for (const SimRow& row : rows) {
    if (row.result == "error") {
      std::cerr << program << ": " << row.trace << " " << row.policy << ": " << row.message << "\n";
      status = kFailureExitCode;
    }
  }

  std::string error;
  if (!options.out.empty() && !WriteRows(rows, options.out, options.out_format, &error)) {
    std::cerr << program << ": " << error << "\n";
    return kFailureExitCode;
  }
  if (!options.timeline.empty()) {
    if (absl::Status drawn = DrawTimeline(timeline, rows.front(), options.timeline); !drawn.ok()) {
      std::cerr << program << ": timeline: " << drawn.message() << "\n";
      return kFailureExitCode;
    }
  }
  if (!options.plot.empty()) {
    // The plot script reads CSV: reuse --out when it is CSV, else write a temporary CSV.
    std::string csv = options.out_format == OutFormat::kCsv ? options.out : "";
    std::string temporary;
    if (csv.empty()) {
      const char* tmpdir = std::getenv("TMPDIR");
      std::string pattern = absl::StrCat(tmpdir && *tmpdir ? tmpdir : "/tmp", "/remat-sim-XXXXXX.csv");
      const int fd = ::mkstemps(pattern.data(), 4);
      if (fd < 0) {
        std::cerr << program << ": cannot create a temporary CSV for the plot in " << pattern << "\n";
        return kFailureExitCode;
      }
      ::close(fd);
      temporary = csv = pattern;
      if (!WriteRows(rows, csv, OutFormat::kCsv, &error)) {
        std::cerr << program << ": " << error << "\n";
        std::error_code ignored;
        std::filesystem::remove(temporary, ignored);
        return kFailureExitCode;
      }
    }
    absl::Status plotted = RunPlot(FindPython(), PlotScriptPath(), csv, options.plot);
    if (!temporary.empty()) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
    }
    if (!plotted.ok()) {
      std::cerr << program << ": plot: " << plotted.message() << "\n";
      return kFailureExitCode;
    }
  }
  return status;
}

}  // namespace
}  // namespace remat::sim

int main(int argc, char** argv) { return remat::sim::Main(argc, argv); }
