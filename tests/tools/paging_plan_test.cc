// Paged schedules and the joint drop-or-page plan: the checker times page-outs and page-ins with the engine's link
// model (a stall when an op waits for its input's copy) and rejects impossible page steps; the ILP's paging plan is
// valid in the budget, never worse than the drop-only optimum and never better than the compute alone, pays off when
// copies are cheaper than recomputation and pages nothing when they are not.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tools/plan_traces.h"
#include "tools/checkmate_planner.h"
#include "tools/schedule_check.h"

namespace remat::plan {
namespace {

using ::testing::HasSubstr;

PagingOptions Link(double bytes_per_s, std::int64_t latency_ns = 0) {
  PagingOptions link;
  link.bandwidth_bytes_per_s = bytes_per_s;
  link.latency_ns = latency_ns;
  return link;
}

std::vector<PlanStep> Steps(std::initializer_list<std::pair<char, std::int32_t>> list) {
  std::vector<PlanStep> steps;
  for (const auto& [kind, index] : list) {
    steps.push_back({kind == 'r' ? StepKind::kRun : kind == 'o' ? StepKind::kPageOut : StepKind::kPageIn, index});
  }
  return steps;
}

// kChain at 300 bytes: a (value 0) goes to the host after op1 and comes back for op3. At 100 bytes per ns a copy
// of a takes 1 ns: the page-out ends at 7, op2 runs 6..7, the page-in is issued at 7 and ends at 8, so op3 waits
// 1 ns: op time 8, stall 1, overhead 9/8 (recomputing a instead costs 5: 13/8).
TEST(PagedScheduleTest, TheLinkModelTimesCopiesAndStalls) {
  const PlanProblem p = testing::BuildProblem(testing::kChain);
  const PagingOptions link = Link(100e9);
  const ScheduleVerdict v =
      CheckSteps(p, 300, &link, Steps({{'r', 0}, {'r', 1}, {'o', 0}, {'r', 2}, {'i', 0}, {'r', 3}}));
  ASSERT_TRUE(v.valid) << v.violation;
  EXPECT_EQ(v.total_ns, 8);
  EXPECT_EQ(v.stall_ns, 1);
  EXPECT_DOUBLE_EQ(v.overhead, 9.0 / 8.0);
  EXPECT_EQ(v.page_outs, 1);
  EXPECT_EQ(v.page_ins, 1);
  EXPECT_EQ(v.host_peak_bytes, 100);
  EXPECT_LE(v.peak_bytes, 300);
  // With 2 us of latency per copy the stall is the page-in's whole wait behind the page-out on the FIFO link.
  const PagingOptions slow = Link(100e9, 2000);
  const ScheduleVerdict w =
      CheckSteps(p, 300, &slow, Steps({{'r', 0}, {'r', 1}, {'o', 0}, {'r', 2}, {'i', 0}, {'r', 3}}));
  ASSERT_TRUE(w.valid) << w.violation;
  EXPECT_EQ(w.stall_ns, (6 + 2001 + 2001) - 7);
}

TEST(PagedScheduleTest, ImpossiblePageStepsAreRejected) {
  const PlanProblem p = testing::BuildProblem(testing::kChain);
  const PagingOptions link = Link(100e9);
  // Paged in without a host copy.
  ScheduleVerdict v = CheckSteps(p, 500, &link, Steps({{'r', 0}, {'i', 0}, {'r', 1}, {'r', 2}, {'r', 3}}));
  EXPECT_FALSE(v.valid);
  EXPECT_THAT(v.violation, HasSubstr("no host copy"));
  // Paged out before it exists.
  v = CheckSteps(p, 500, &link, Steps({{'o', 1}, {'r', 0}, {'r', 1}, {'r', 2}, {'r', 3}}));
  EXPECT_THAT(v.violation, HasSubstr("not resident"));
  // Read while on the host.
  v = CheckSteps(p, 500, &link, Steps({{'r', 0}, {'r', 1}, {'o', 0}, {'r', 2}, {'r', 3}}));
  EXPECT_THAT(v.violation, HasSubstr("not resident"));
  // The host budget.
  PagingOptions small = link;
  small.host_budget = 99;
  v = CheckSteps(p, 300, &small, Steps({{'r', 0}, {'r', 1}, {'o', 0}, {'r', 2}, {'i', 0}, {'r', 3}}));
  EXPECT_THAT(v.violation, HasSubstr("host budget"));
  // A page-in over the budget.
  v = CheckSteps(p, 250, &link, Steps({{'r', 0}, {'o', 0}, {'r', 1}, {'i', 0}, {'r', 2}, {'r', 3}}));
  EXPECT_FALSE(v.valid);
  // Without paging, a page step is a violation.
  v = CheckSteps(p, 500, nullptr, Steps({{'r', 0}, {'r', 1}, {'o', 0}, {'r', 2}, {'i', 0}, {'r', 3}}));
  EXPECT_THAT(v.violation, HasSubstr("without paging"));
}

PlanOutcome Plan(const PlanProblem& p, std::int64_t budget, bool paging, const PagingOptions& link) {
  PlannerOptions options;
  options.time_limit_s = 60;
  options.paging = paging;
  options.link = link;
  absl::StatusOr<PlanOutcome> outcome = PlanCheckmate(p, budget, options);
  EXPECT_TRUE(outcome.ok()) << outcome.status();
  return outcome.ok() ? *outcome : PlanOutcome{};
}

// Training chains at several budgets, with a link whose copies cost about a recomputation: the paging plan is valid
// in the budget, between the compute alone (1.0) and the drop-only optimum, and below it somewhere.
TEST(PagingPlanTest, NeverWorseThanDropOnlyNeverBetterThanTheCompute) {
  const PlanProblem p = testing::BuildProblem(testing::TrainingTrace(5).c_str());
  const std::int64_t peak = CheckSchedule(p, INT64_MAX, OriginalOrder(p)).peak_bytes;
  const PagingOptions link = Link(50e9);  // 100..174 bytes: 2..4 ns a copy, ops take 1 to 22 ns
  int cheaper = 0;
  for (double ratio : {0.8, 0.6, 0.45, 0.35}) {
    const std::int64_t budget = static_cast<std::int64_t>(static_cast<double>(peak) * ratio);
    SCOPED_TRACE(ratio);
    const PlanOutcome drop = Plan(p, budget, false, link);
    const PlanOutcome page = Plan(p, budget, true, link);
    if (drop.status == PlanStatus::kInfeasible) {
      EXPECT_NE(page.status, PlanStatus::kTooBig);
      continue;
    }
    ASSERT_EQ(drop.status, PlanStatus::kOptimal);
    ASSERT_EQ(page.status, PlanStatus::kOptimal);
    EXPECT_LE(page.overhead, drop.overhead + 1e-12);
    EXPECT_GE(page.overhead, 1.0);
    const ScheduleVerdict v = CheckSteps(p, budget, &link, page.steps);
    ASSERT_TRUE(v.valid) << v.violation;
    EXPECT_LE(v.peak_bytes, budget);
    EXPECT_DOUBLE_EQ(v.overhead, page.overhead);
    if (page.overhead < drop.overhead) ++cheaper;
  }
  EXPECT_GE(cheaper, 1);
}

TEST(PagingPlanTest, ASlowLinkPagesNothing) {
  const PlanProblem p = testing::BuildProblem(testing::kChain);
  const PlanOutcome page = Plan(p, 300, true, Link(1e9, 1000));  // a copy takes over 1 us, a recomputation 5 ns
  ASSERT_EQ(page.status, PlanStatus::kOptimal);
  EXPECT_DOUBLE_EQ(page.overhead, 13.0 / 8.0);
  EXPECT_EQ(page.page_outs + page.page_ins, 0);
  const PlanOutcome fast = Plan(p, 300, true, Link(100e9));
  ASSERT_EQ(fast.status, PlanStatus::kOptimal);
  EXPECT_DOUBLE_EQ(fast.overhead, 9.0 / 8.0);  // the schedule of TheLinkModelTimesCopiesAndStalls
  EXPECT_EQ(fast.page_outs, 1);
}

}  // namespace
}  // namespace remat::plan
