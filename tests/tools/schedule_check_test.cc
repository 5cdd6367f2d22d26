// ScheduleCheck: valid schedules cost what they run; invalid ones (over budget, reading what is not there, out of
// order, recomputing what makes no value, a constant read after its release) are rejected with the reason.
#include "tools/schedule_check.h"

#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tools/plan_traces.h"

namespace remat::plan {
namespace {

using ::testing::HasSubstr;

PlanProblem Build(const char* text) { return testing::BuildProblem(text); }

TEST(ScheduleCheckTest, OriginalOrderFreesEachValueAfterItsLastRead) {
  const PlanProblem p = Build(testing::kChain);
  // b goes after op2 (its last read), so op3 needs a + c + d = 300; op2 needs a + b + c = 400.
  const ScheduleVerdict v = CheckSchedule(p, 400, OriginalOrder(p));
  ASSERT_TRUE(v.valid) << v.violation;
  EXPECT_EQ(v.peak_bytes, 400);
  EXPECT_EQ(v.total_ns, 8);
  EXPECT_DOUBLE_EQ(v.overhead, 1.0);
  EXPECT_EQ(v.recomputations, 0);
}

TEST(ScheduleCheckTest, OverBudgetIsRejected) {
  const PlanProblem p = Build(testing::kChain);
  const ScheduleVerdict v = CheckSchedule(p, 300, OriginalOrder(p));
  EXPECT_FALSE(v.valid);
  EXPECT_THAT(v.violation, HasSubstr("op 2"));
  EXPECT_THAT(v.violation, HasSubstr("over the budget of 300"));
}

TEST(ScheduleCheckTest, RecomputingTheFirstValueFitsTheTighterBudget) {
  const PlanProblem p = Build(testing::kChain);
  // a is last read by op1 before it is made again, so it goes after op1; op0 runs again before op3.
  const ScheduleVerdict v = CheckSchedule(p, 300, {0, 1, 2, 0, 3});
  ASSERT_TRUE(v.valid) << v.violation;
  EXPECT_EQ(v.total_ns, 13);
  EXPECT_EQ(v.recompute_ns, 5);
  EXPECT_EQ(v.recomputations, 1);
  EXPECT_EQ(v.peak_bytes, 300);
  EXPECT_DOUBLE_EQ(v.overhead, 13.0 / 8.0);
}

TEST(ScheduleCheckTest, MalformedSchedulesAreRejected) {
  const PlanProblem p = Build(testing::kChain);
  EXPECT_THAT(CheckSchedule(p, 1000, {0, 2, 1, 3}).violation, HasSubstr("runs before its place"));
  EXPECT_THAT(CheckSchedule(p, 1000, {0, 1, 2}).violation, HasSubstr("never runs"));
  EXPECT_THAT(CheckSchedule(p, 1000, {0, 1, 2, 3, 7}).violation, HasSubstr("no such op"));
}

TEST(ScheduleCheckTest, ReadingAValueConsumedInPlaceIsRejected) {
  const PlanProblem p = Build(testing::kWrites);
  // Recomputing the view op is not allowed (it makes no value); recomputing add_ after it consumed x needs x again.
  EXPECT_THAT(CheckSchedule(p, 1000, {0, 1, 2, 1, 3}).violation, HasSubstr("makes no value"));
  const ScheduleVerdict again = CheckSchedule(p, 1000, {0, 1, 2, 2, 3});
  EXPECT_FALSE(again.valid);
  EXPECT_THAT(again.violation, HasSubstr("not resident"));
  // Recomputing x after add_ reads the constant v, which was released after op0.
  EXPECT_THAT(CheckSchedule(p, 1000, {0, 1, 2, 0, 3}).violation, HasSubstr("after its release"));
}

TEST(ScheduleCheckTest, InPlaceWritesAddNoBytes) {
  const PlanProblem p = Build(testing::kWrites);
  // op0: 96 constants + 100; add_: 64 + 100 (in place); op2: 64 + 100 + 50 = 214.
  const ScheduleVerdict v = CheckSchedule(p, 214, OriginalOrder(p));
  ASSERT_TRUE(v.valid) << v.violation;
  EXPECT_EQ(v.peak_bytes, 214);
  EXPECT_FALSE(CheckSchedule(p, 213, OriginalOrder(p)).valid);
}

}  // namespace
}  // namespace remat::plan
