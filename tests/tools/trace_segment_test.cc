// TraceSegment: a window of ops as a trace of its own; what is live at its start becomes constants.
#include "tools/trace_segment.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/replay.h"
#include "tests/tools/plan_traces.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

TEST(TraceSegmentTest, LiveTensorsAtTheStartBecomeInputOps) {
  absl::StatusOr<Trace> trace = ParseTrace(plan::testing::kChain, "chain.log");
  ASSERT_TRUE(trace.ok()) << trace.status();
  // op2, op3, with a (100 B, made by op0 in 5 ns) and b (200 B, op1, 1 ns) made by segment_input ops.
  absl::StatusOr<Trace> segment = SegmentTrace(*trace, 2, 2);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->path, "chain.log@2+2");
  EXPECT_EQ(segment->call_count, 4);
  EXPECT_EQ(segment->total_time_ns, 8);
  ASSERT_GE(segment->ops.size(), 2u);
  EXPECT_EQ(segment->ops[0].op_name, "segment_input");
  EXPECT_EQ(segment->ops[0].time_ns, 5);
  EXPECT_EQ(segment->ops[1].results[0].bytes, 200);
  absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(*segment);
  ASSERT_TRUE(replayer.ok()) << replayer.status();
  EXPECT_EQ((*replayer)->baseline().memory_bytes, 500);  // a + b + c + d: nothing released before op3 ends
  EXPECT_EQ((*replayer)->baseline().compute_ns, 8);
}

TEST(TraceSegmentTest, TheWholeWindowIsTheTrace) {
  absl::StatusOr<Trace> trace = ParseTrace(plan::testing::kChain, "chain.log");
  ASSERT_TRUE(trace.ok());
  absl::StatusOr<Trace> segment = SegmentTrace(*trace, 0, 4, /*release_at_end=*/false);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->ops.size(), trace->ops.size());
  // Released at the end, the output d (the only name still referenced) goes too.
  absl::StatusOr<Trace> released = SegmentTrace(*trace, 0, 4);
  ASSERT_TRUE(released.ok()) << released.status();
  ASSERT_EQ(released->ops.size(), trace->ops.size() + 1);
  EXPECT_EQ(released->ops.back().kind, TraceOpKind::kRelease);
  EXPECT_EQ(released->names[released->ops.back().args[0]], "d");
  EXPECT_EQ(segment->total_time_ns, trace->total_time_ns);
}

TEST(TraceSegmentTest, WindowsOutsideTheTraceAreErrors) {
  absl::StatusOr<Trace> trace = ParseTrace(plan::testing::kChain, "chain.log");
  ASSERT_TRUE(trace.ok());
  EXPECT_THAT(SegmentTrace(*trace, 3, 2).status().message(), HasSubstr("which has 4 ops"));
  EXPECT_FALSE(SegmentTrace(*trace, 0, 0).ok());
}

}  // namespace
}  // namespace remat
