// Trace recorder: the op stream of a small forward/backward, written as a DTR-format trace, parses with
// runtime/trace.h and says what happened: constants, calls with fresh and aliased results, in-place mutations,
// releases of dead temporaries.
#include "integration/trace_recorder.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/trace.h"

namespace remat::integration {
namespace {

class Forwarding : public OpObserver {
 public:
  explicit Forwarding(TraceRecorder* recorder) : recorder_(recorder) {}
  void BeforeOp(OpRecord&) override {}
  void AfterOp(OpRecord&& record) override { recorder_->OnOp(record); }
  void OpFailed(OpRecord&) noexcept override {}

 private:
  TraceRecorder* recorder_;
};

const TraceOp* FindOp(const Trace& trace, TraceOpKind kind, const std::string& name) {
  for (const TraceOp& op : trace.ops) {
    if (op.kind == kind && op.op_name == name) return &op;
  }
  return nullptr;
}

TEST(TraceRecorder, ForwardBackwardTraceParsesAndDescribesTheOps) {
  const std::string path = ::testing::TempDir() + "/remat_trace_recorder_test.jsonl";
  absl::StatusOr<std::unique_ptr<TraceRecorder>> recorder = TraceRecorder::Open(path);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  Forwarding observer(recorder->get());
  SetObserver(&observer);
  at::Tensor x = at::ones({4, 8});
  at::Tensor w = at::ones({8, 8}).set_requires_grad(true);
  {
    ScopedHook hook;
    at::Tensor h = at::mm(x, w);
    h.mul_(0.5);                  // in place
    at::Tensor t = h.transpose(0, 1);  // a view
    at::sum(at::relu(t)).backward();
  }
  SetObserver(nullptr);
  ASSERT_TRUE((*recorder)->Close().ok());
  EXPECT_GE((*recorder)->ops_written(), 6u);

  absl::StatusOr<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->call_count, static_cast<std::int64_t>((*recorder)->ops_written()));

  const TraceOp* mm = FindOp(*trace, TraceOpKind::kCall, "aten::mm");
  ASSERT_NE(mm, nullptr);
  ASSERT_EQ(mm->args.size(), 2u);
  ASSERT_EQ(mm->results.size(), 1u);
  EXPECT_EQ(mm->results[0].bytes, 4 * 8 * 4);
  EXPECT_EQ(mm->results[0].alias, -1);
  // x and w were made before recording: constants with their sizes.
  int constants = 0;
  for (const TraceOp& op : trace->ops) {
    if (op.kind == TraceOpKind::kConstant && (op.name == mm->args[0] || op.name == mm->args[1])) {
      ++constants;
      EXPECT_EQ(op.bytes, op.name == mm->args[0] ? 4 * 8 * 4 : 8 * 8 * 4);
    }
  }
  EXPECT_EQ(constants, 2);

  const TraceOp* mul_ = FindOp(*trace, TraceOpKind::kMutate, "aten::mul_.Scalar");
  ASSERT_NE(mul_, nullptr);
  EXPECT_THAT(mul_->mutated, ::testing::ElementsAre(0));
  EXPECT_EQ(mul_->args[0], mm->results[0].name) << "the mutation is of mm's result";

  const TraceOp* transpose = FindOp(*trace, TraceOpKind::kCall, "aten::transpose.int");
  ASSERT_NE(transpose, nullptr);
  ASSERT_EQ(transpose->results.size(), 1u);
  EXPECT_EQ(transpose->results[0].alias, 0);
  EXPECT_EQ(transpose->args[0], mm->results[0].name);

  EXPECT_NE(FindOp(*trace, TraceOpKind::kCall, "aten::threshold_backward"), nullptr) << "backward ops recorded";
  // relu's result died with the graph after backward: released.
  const TraceOp* relu = FindOp(*trace, TraceOpKind::kCall, "aten::relu");
  ASSERT_NE(relu, nullptr);
  const bool released = std::any_of(trace->ops.begin(), trace->ops.end(), [&](const TraceOp& op) {
    return op.kind == TraceOpKind::kRelease && op.args.size() == 1 && op.args[0] == relu->results[0].name;
  });
  EXPECT_TRUE(released);
  std::remove(path.c_str());
}

TEST(TraceRecorder, UnwritablePathIsAnError) {
  EXPECT_FALSE(TraceRecorder::Open("/nonexistent-dir/trace.jsonl").ok());
}

}  // namespace
}  // namespace remat::integration
