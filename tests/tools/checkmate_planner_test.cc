// CheckmatePlanner: the ILP's optimum on hand-made traces equals the hand-computed optimum, is never worse than any
// policy's overhead at the same budget, proves infeasibility, and refuses models above the size limit.
// Runs tools/checkmate_ilp.py with the venv's Python (scripts/setup.sh installs highspy there).
#include "tools/checkmate_planner.h"

#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/replay.h"
#include "tests/tools/plan_traces.h"
#include "tools/schedule_check.h"

namespace remat::plan {
namespace {

using ::testing::HasSubstr;

Trace Parse(const std::string& text) {
  absl::StatusOr<Trace> trace = ParseTrace(text, "t.log");
  EXPECT_TRUE(trace.ok()) << trace.status();
  return *std::move(trace);
}

PlanOutcome Plan(const Trace& trace, std::int64_t budget, PlannerOptions options = {}) {
  absl::StatusOr<PlanProblem> problem = BuildPlanProblem(trace);
  EXPECT_TRUE(problem.ok()) << problem.status();
  options.time_limit_s = 60;
  absl::StatusOr<PlanOutcome> outcome = PlanCheckmate(*problem, budget, options);
  EXPECT_TRUE(outcome.ok()) << outcome.status();
  return outcome.ok() ? *outcome : PlanOutcome{};
}

TEST(CheckmatePlannerTest, ChainOptimumIsTheHandComputedOne) {
  const Trace trace = Parse(testing::kChain);
  const PlanOutcome roomy = Plan(trace, 500);
  EXPECT_EQ(roomy.status, PlanStatus::kOptimal) << roomy.message;
  EXPECT_DOUBLE_EQ(roomy.overhead, 1.0);
  const PlanOutcome tight = Plan(trace, 300);
  EXPECT_EQ(tight.status, PlanStatus::kOptimal) << tight.message;
  EXPECT_DOUBLE_EQ(tight.overhead, 13.0 / 8.0);
  EXPECT_EQ(tight.recomputations, 1);
  EXPECT_LE(tight.peak_bytes, 300);
  EXPECT_NEAR(tight.lower_bound_overhead, 13.0 / 8.0, 1e-3);
  EXPECT_EQ(Plan(trace, 250).status, PlanStatus::kInfeasible);
}

TEST(CheckmatePlannerTest, OptimumIsNeverWorseThanAPolicy) {
  const Trace trace = Parse(testing::TrainingTrace(7));
  absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(trace);
  ASSERT_TRUE(replayer.ok()) << replayer.status();
  int compared = 0;
  for (double ratio : {1.0, 0.8, 0.6, 0.5, 0.4, 0.3}) {
    const std::int64_t budget =
        static_cast<std::int64_t>(static_cast<double>((*replayer)->baseline().memory_bytes) * ratio);
    const PlanOutcome opt = Plan(trace, budget);
    for (const auto& policy : PolicyNames()) {
      ReplayOptions o;
      o.policy = std::string(policy);
      o.budget_bytes = budget;
      o.overhead_limit = 0;
      const ReplayResult r = (*replayer)->Run(o);
      if (r.status != ReplayStatus::kPass) continue;
      ++compared;
      ASSERT_EQ(opt.status, PlanStatus::kOptimal) << "ratio " << ratio << ": " << policy << " passes";
      EXPECT_LE(opt.overhead, r.overhead + 1e-12) << "ratio " << ratio << ", policy " << policy;
    }
    if (ratio == 1.0) {
      EXPECT_DOUBLE_EQ(opt.overhead, 1.0);
    }
  }
  EXPECT_GT(compared, 20);
}

// The checker and the engine count alike: every policy's run, replayed offline from its schedule, is valid at the
// same budget and costs the engine's op time exactly (remat-sim --planner relies on this for its starts).
TEST(CheckmatePlannerTest, PolicyRunsCheckAtTheEnginesCost) {
  const Trace trace = Parse(testing::TrainingTrace(9));
  absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(trace);
  ASSERT_TRUE(replayer.ok()) << replayer.status();
  absl::StatusOr<PlanProblem> problem = BuildPlanProblem(trace);
  ASSERT_TRUE(problem.ok()) << problem.status();
  int checked = 0;
  for (double ratio : {0.9, 0.7, 0.5, 0.4}) {
    for (const auto& policy : PolicyNames()) {
      std::vector<std::int32_t> schedule;
      ReplayOptions o;
      o.policy = std::string(policy);
      o.budget_ratio = ratio;
      o.overhead_limit = 0;
      o.schedule = &schedule;
      const ReplayResult r = (*replayer)->Run(o);
      if (r.status != ReplayStatus::kPass) continue;
      const ScheduleVerdict verdict = CheckSchedule(*problem, r.budget_bytes, schedule);
      ASSERT_TRUE(verdict.valid) << policy << " at " << ratio << ": " << verdict.violation;
      EXPECT_EQ(verdict.total_ns, r.total_compute_ns) << policy << " at " << ratio;
      EXPECT_LE(verdict.peak_bytes, r.peak_bytes) << policy << " at " << ratio;  // the checker frees at once
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(CheckmatePlannerTest, ModelsAboveTheLimitAreRefusedWithAdvice) {
  PlannerOptions options;
  options.max_binaries = 3;
  const PlanOutcome outcome = Plan(Parse(testing::kChain), 300, options);
  EXPECT_EQ(outcome.status, PlanStatus::kTooBig);
  EXPECT_THAT(outcome.message, HasSubstr("--segment"));
}

TEST(CheckmatePlannerTest, InPlaceWritesAndConstantsArePlanned) {
  const Trace trace = Parse(testing::kWrites);
  EXPECT_EQ(Plan(trace, 214).status, PlanStatus::kOptimal);
  EXPECT_DOUBLE_EQ(Plan(trace, 214).overhead, 1.0);
  EXPECT_EQ(Plan(trace, 213).status, PlanStatus::kInfeasible);  // op2 needs x', y and w whatever happens
}

TEST(CheckmatePlannerTest, MissingSolverSaysHowToInstallIt) {
  PlannerOptions options;
  options.python = "/nonexistent/python";
  absl::StatusOr<PlanProblem> problem = BuildPlanProblem(Parse(testing::kChain));
  ASSERT_TRUE(problem.ok());
  absl::StatusOr<PlanOutcome> outcome = PlanCheckmate(*problem, 300, options);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(outcome.status().message(), HasSubstr("REMAT_PYTHON"));
}

}  // namespace
}  // namespace remat::plan
