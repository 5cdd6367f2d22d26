// Trace replay beyond parity: copy-on-write MUTATE, COPY_FROM, outputs resident at the end, the engine's own model
// (simrd_compat off), arena mode with every policy, bad options.
#include "runtime/replay.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

const char* kSmall = R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"mm","RESULT":["a"],"TIME":"10"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"ARGS":["a"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["b"],"TIME":"5"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"b"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"b"}
{"ARGS":["b","w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"3"}
{"DST":"c","INSTRUCTION":"COPY","SRC":"a"}
{"DST":"c","INSTRUCTION":"COPY_FROM","SRC":"b"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
)";

TEST(ReplayTest, SmallTraceUnconstrainedAndConstrained) {
  absl::StatusOr<Trace> t = ParseTrace(kSmall, "small.log");
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::unique_ptr<Replayer>> r = Replayer::Create(*t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->baseline().compute_ns, 18);
  // w 100 + a 100 + b 100 + the copy-on-write output of add_ 100 (old b still referenced during the op).
  EXPECT_EQ((*r)->baseline().memory_bytes, 400);
  ReplayOptions o;
  o.budget_ratio = 1.0;
  ReplayResult full = (*r)->Run(o);
  EXPECT_EQ(full.status, ReplayStatus::kPass) << full.message;
  EXPECT_DOUBLE_EQ(full.overhead, 1.0);
  o.budget_bytes = 300;  // add_ needs a to go (it is not an input); nothing replays before the end
  ReplayResult tight = (*r)->Run(o);
  EXPECT_EQ(tight.status, ReplayStatus::kPass) << tight.message;
  EXPECT_GE(tight.evictions, 1);
  o.budget_bytes = 150;
  EXPECT_EQ((*r)->Run(o).status, ReplayStatus::kOom);
  o.policy = "nope";
  ReplayResult bad = (*r)->Run(o);
  EXPECT_EQ(bad.status, ReplayStatus::kError);
  EXPECT_THAT(bad.message, ::testing::HasSubstr("unknown policy"));
}

TEST(ReplayTest, SharedTracesInEveryModeAndPolicy) {
  const char* env = std::getenv("REMAT_SHARED_DIR");
  std::string dir = std::string(env != nullptr && *env ? env : "/work/main/../shared") + "/traces/dtr/";
  absl::StatusOr<Trace> t = ReadTrace(dir + "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log");
  ASSERT_TRUE(t.ok()) << t.status() << " (set REMAT_SHARED_DIR to the shared directory)";
  absl::StatusOr<std::unique_ptr<Replayer>> r = Replayer::Create(*t);
  ASSERT_TRUE(r.ok());
  for (const char* policy : {"dtr", "dtr-eq", "dtr-local", "msps", "lru", "largest", "random", "dte", "coop"}) {
    for (AccountingMode mode : {AccountingMode::kCounter, AccountingMode::kArena}) {
      for (bool compat : {true, false}) {
        ReplayOptions o;
        o.policy = policy;
        o.mode = mode;
        o.simrd_compat = compat;
        o.budget_ratio = 0.6;
        ReplayResult res = (*r)->Run(o);
        EXPECT_NE(res.status, ReplayStatus::kError) << policy << ": " << res.message;
        if (res.status == ReplayStatus::kPass) {
          EXPECT_LE(res.peak_bytes, res.budget_bytes) << policy;
          EXPECT_GE(res.overhead, 1.0) << policy;
        }
        if (mode == AccountingMode::kArena && res.evictions > 0) {
          EXPECT_GT(res.fragmentation_rate, 0) << policy;
        }
      }
    }
  }
}

}  // namespace
}  // namespace remat
