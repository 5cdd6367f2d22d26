// PlanProblem: values, ops, constants' lifetimes and outputs from a trace, as the product engine sees them.
#include "tools/plan_problem.h"

#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tools/plan_traces.h"

namespace remat::plan {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

PlanProblem Build(const char* text) { return testing::BuildProblem(text); }

TEST(PlanProblemTest, ChainHasOneValuePerResultAndTheUnreleasedOneIsTheOutput) {
  const PlanProblem p = Build(testing::kChain);
  ASSERT_EQ(p.ops.size(), 4u);
  ASSERT_EQ(p.values.size(), 4u);
  EXPECT_EQ(p.compute_ns, 8);
  EXPECT_THAT(p.ops[3].inputs, ElementsAre(2, 0));  // c, a
  EXPECT_THAT(p.ops[1].fresh, ElementsAre(1));
  EXPECT_EQ(p.values[1].bytes, 200);
  EXPECT_FALSE(p.values[0].output);
  EXPECT_TRUE(p.values[3].output);
  EXPECT_THAT(p.stage_constant_bytes, ElementsAre(0, 0, 0, 0, 0));
}

TEST(PlanProblemTest, ViewsReadTheirStorageAndWritesAreInPlace) {
  const PlanProblem p = Build(testing::kWrites);
  ASSERT_EQ(p.ops.size(), 4u);
  ASSERT_EQ(p.values.size(), 3u);  // x, x' (written in place), y
  EXPECT_THAT(p.ops[0].constant_inputs, ElementsAre(0, 1));
  EXPECT_FALSE(p.ops[1].recomputable());  // the view op makes no value
  EXPECT_THAT(p.ops[1].inputs, ElementsAre(0));
  EXPECT_THAT(p.ops[2].fresh, IsEmpty());
  EXPECT_THAT(p.ops[2].in_place, ElementsAre(std::make_pair(0, 1)));
  EXPECT_THAT(p.ops[2].inputs, ElementsAre(0));
  EXPECT_EQ(p.values[1].bytes, 100);
  EXPECT_THAT(p.ops[3].inputs, ElementsAre(1));  // op2 reads the written value
  EXPECT_TRUE(p.values[2].output);
  EXPECT_FALSE(p.values[1].output);
  // w lives to the end; v is released after op0: it is in memory in stage 0 only.
  EXPECT_THAT(p.constant_death, ElementsAre(5, 1));
  EXPECT_THAT(p.stage_constant_bytes, ElementsAre(96, 64, 64, 64, 64));
}

}  // namespace
}  // namespace remat::plan
