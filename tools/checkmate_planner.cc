#include "tools/checkmate_planner.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/link_model.h"
#include "tools/plot_launcher.h"
#include "tools/schedule_check.h"

extern char** environ;

namespace remat::plan {
namespace {

std::string ScriptPath(const PlannerOptions& options) {
  if (!options.script.empty()) return options.script;
  if (const char* s = std::getenv("REMAT_CHECKMATE_SCRIPT"); s != nullptr && *s != '\0') return s;
  return REMAT_CHECKMATE_SCRIPT_DEFAULT;
}

bool Verbose(const PlannerOptions& options) {
  const char* env = std::getenv("REMAT_PLANNER_VERBOSE");
  return options.verbose || (env != nullptr && *env != '\0' && std::string(env) != "0");
}

nlohmann::json ProblemJson(const PlanProblem& problem, std::int64_t budget, const PlannerOptions& options) {
  nlohmann::json j;
  j["budget"] = budget;
  j["time_limit_s"] = options.time_limit_s;
  j["verbose"] = Verbose(options);
  j["stage_constant_bytes"] = problem.stage_constant_bytes;
  j["constant_death"] = problem.constant_death;
  nlohmann::json values = nlohmann::json::array();
  for (const PlanValue& v : problem.values) {
    values.push_back({{"bytes", v.bytes}, {"producer", v.producer}, {"output", v.output}});
  }
  j["values"] = std::move(values);
  nlohmann::json ops = nlohmann::json::array();
  for (const PlanOp& op : problem.ops) {
    nlohmann::json in_place = nlohmann::json::array();
    for (const auto& [old_value, made] : op.in_place) in_place.push_back({old_value, made});
    ops.push_back({{"time_ns", op.time_ns},
                   {"inputs", op.inputs},
                   {"constant_inputs", op.constant_inputs},
                   {"fresh", op.fresh},
                   {"in_place", std::move(in_place)}});
  }
  j["ops"] = std::move(ops);
  j["start"] = options.start;
  if (options.paging) {
    const LinkModel link(options.link);
    std::vector<std::int64_t> transfer;
    for (const PlanValue& v : problem.values) transfer.push_back(link.TransferNs(v.bytes));
    nlohmann::json paging = {{"transfer_ns", transfer}};
    if (options.link.host_budget < std::numeric_limits<std::int64_t>::max()) {
      paging["host_budget"] = options.link.host_budget;
    } else {
      paging["host_budget"] = nullptr;
    }
    j["paging"] = std::move(paging);
  }
  return j;
}

// Runs `python script problem result`; exit 3 means highspy is missing.
absl::Status RunHelper(const std::string& python, const std::string& script, const std::string& problem,
                       const std::string& result, bool verbose) {
  std::vector<std::string> args = {python, script, problem, result};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The solver's banner and log (HiGHS prints on stdout) go to stderr when verbose, else nowhere: never into
  // remat-sim's table on stdout. The helper's own errors are on stderr.
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  if (verbose) {
    ::posix_spawn_file_actions_adddup2(&actions, 2, 1);
  } else {
    ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = 0;
  const int error = ::posix_spawnp(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot run the planner's interpreter '", python, "': ",
                                                      std::strerror(error), " (set REMAT_PYTHON)"));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid failed for the checkmate helper");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the MIP solver (highspy) is not available to '", python,
        "': run scripts/setup.sh (it installs highspy into the venv) or set REMAT_PYTHON to a Python that has it"));
  }
  return absl::InternalError(absl::StrCat("the checkmate helper failed (", script, ", ",
                                          WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                                                            : absl::StrCat("signal ", WTERMSIG(status)),
                                          ")"));
}

}  // namespace

std::string_view ToString(PlanStatus status) {
  switch (status) {
    case PlanStatus::kOptimal: return "optimal";
    case PlanStatus::kFeasible: return "feasible";
    case PlanStatus::kInfeasible: return "infeasible";
    case PlanStatus::kUnsolved: return "unsolved";
    case PlanStatus::kTooBig: return "too-big";
  }
  return "unsolved";
}

std::int64_t CountBinaries(const PlanProblem& problem, bool paging) {
  const std::int64_t stages = static_cast<std::int64_t>(problem.ops.size());  // the end stage is `stages`
  std::int64_t count = 0;
  for (std::size_t i = 0; i < problem.ops.size(); ++i) {
    const PlanOp& op = problem.ops[i];
    if (!op.recomputable()) continue;
    std::int64_t last = stages;
    for (std::int32_t c : op.constant_inputs) last = std::min<std::int64_t>(last, problem.constant_death[c] - 1);
    count += std::max<std::int64_t>(0, last - static_cast<std::int64_t>(i));
  }
  std::vector<bool> read(problem.values.size(), false);
  for (const PlanOp& op : problem.ops) {
    for (std::int32_t v : op.inputs) read[v] = true;
  }
  for (std::size_t v = 0; v < problem.values.size(); ++v) {
    if (read[v] || problem.values[v].output) {
      count += (paging ? 4 : 1) * (stages - problem.values[v].producer);  // S, and O, I, H with paging
    }
  }
  return count;
}

absl::StatusOr<PlanOutcome> PlanCheckmate(const PlanProblem& problem, std::int64_t budget,
                                          const PlannerOptions& options) {
  const auto begin = std::chrono::steady_clock::now();
  PlanOutcome outcome;
  outcome.binaries = CountBinaries(problem, options.paging);
  if (outcome.binaries > options.max_binaries) {
    outcome.status = PlanStatus::kTooBig;
    outcome.message = absl::StrCat("the ILP would have ", outcome.binaries, " binaries (", problem.ops.size(),
                                   " ops), above the limit of ", options.max_binaries,
                                   " (--planner-max-binaries): plan a part of the trace with --segment FIRST+COUNT");
    return outcome;
  }
  const char* tmpdir = std::getenv("TMPDIR");
  std::string dir = absl::StrCat(tmpdir && *tmpdir ? tmpdir : "/tmp", "/remat-plan-XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory ", dir, ": ", std::strerror(errno)));
  }
  const std::string problem_path = dir + "/problem.json", result_path = dir + "/result.json";
  auto cleanup = [&] {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  };
  {
    std::ofstream out(problem_path);
    out << ProblemJson(problem, budget, options);
    if (!out) {
      cleanup();
      return absl::InternalError(absl::StrCat("cannot write ", problem_path));
    }
  }
  if (absl::Status s = RunHelper(options.python.empty() ? sim::FindPython() : options.python, ScriptPath(options),
                                 problem_path, result_path, Verbose(options));
      !s.ok()) {
    cleanup();
    return s;
  }
  nlohmann::json result;
  {
    std::ifstream in(result_path);
    result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  cleanup();
  if (result.is_discarded() || !result.is_object()) return absl::InternalError("the checkmate helper wrote no result");
  outcome.solver = result.value("solver", "");
  outcome.solve_s = result.value("solve_s", 0.0);
  if (result.contains("bound_ns") && result["bound_ns"].is_number() && problem.compute_ns > 0) {
    outcome.lower_bound_overhead = result["bound_ns"].get<double>() / static_cast<double>(problem.compute_ns);
  }
  const std::string status = result.value("status", "error");
  outcome.start_accepted = result.value("start_accepted", false);
  auto check = [&](const std::vector<PlanStep>& steps) {
    return CheckSteps(problem, budget, options.paging ? &options.link : nullptr, steps);
  };
  ScheduleVerdict start;
  std::vector<PlanStep> start_steps;
  for (std::int32_t k : options.start) start_steps.push_back({StepKind::kRun, k});
  if (!options.start.empty()) {
    start = check(start_steps);
    if (!start.valid) return absl::InvalidArgumentError(absl::StrCat("the start schedule fails the check: ", start.violation));
  }
  auto use = [&](const ScheduleVerdict& verdict, std::vector<PlanStep> steps) {
    outcome.overhead = verdict.overhead;
    outcome.peak_bytes = verdict.peak_bytes;
    outcome.recomputations = verdict.recomputations;
    outcome.stall_ns = verdict.stall_ns;
    outcome.page_outs = verdict.page_outs;
    outcome.page_ins = verdict.page_ins;
    outcome.steps = std::move(steps);
  };
  auto cost = [](const ScheduleVerdict& verdict) { return verdict.total_ns + verdict.stall_ns; };
  if (status == "infeasible" && start.valid) {
    // The ILP's memory model is stricter than the checker's (double counts, see checkmate_ilp.py): the start fits
    // the budget while no ILP schedule does. The start is still a valid answer.
    outcome.status = PlanStatus::kFeasible;
    outcome.from_start = true;
    use(start, start_steps);
  } else if (status == "infeasible") {
    outcome.status = PlanStatus::kInfeasible;
  } else if (result.contains("schedule")) {
    outcome.status = status == "optimal" ? PlanStatus::kOptimal : PlanStatus::kFeasible;
    std::vector<PlanStep> steps;
    if (options.paging && result.contains("steps")) {
      for (const auto& step : result["steps"]) {
        const int kind = step[0].get<int>();
        steps.push_back({kind == 0 ? StepKind::kRun : kind == 1 ? StepKind::kPageOut : StepKind::kPageIn,
                         step[1].get<std::int32_t>()});
      }
    } else {
      for (std::int32_t k : result["schedule"].get<std::vector<std::int32_t>>()) steps.push_back({StepKind::kRun, k});
    }
    const ScheduleVerdict verdict = check(steps);
    if (!verdict.valid) {
      return absl::InternalError(absl::StrCat("the ILP's schedule fails the check: ", verdict.violation));
    }
    use(verdict, std::move(steps));
    if (start.valid && cost(start) < cost(verdict)) {
      outcome.status = PlanStatus::kFeasible;
      outcome.from_start = true;
      use(start, start_steps);
    }
  } else if (status == "time-limit" && start.valid) {
    outcome.status = PlanStatus::kFeasible;
    outcome.from_start = true;
    use(start, start_steps);
  } else if (status == "time-limit") {
    outcome.status = PlanStatus::kUnsolved;
    outcome.message = absl::StrFormat("no schedule found within the time limit of %g s (--planner-time-limit)",
                                      options.time_limit_s);
  } else {
    return absl::InternalError(absl::StrCat("the solver ended with model status '",
                                            result.value("model_status", "?"), "'"));
  }
  if (options.paging) {
    // The solver's bound is for the ILP's upper-bound cost of copies (see the contract), not for the schedule's
    // cost with overlap: the only bound left is the compute itself.
    outcome.lower_bound_overhead = 0;
  }
  if (outcome.status == PlanStatus::kFeasible && outcome.lower_bound_overhead > 0 &&
      outcome.overhead <= outcome.lower_bound_overhead * (1 + 1e-4)) {
    outcome.status = PlanStatus::kOptimal;  // the bound meets the schedule (within the solver's gap)
  }
  outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return outcome;
}

}  // namespace remat::plan
