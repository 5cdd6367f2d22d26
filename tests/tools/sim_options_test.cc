#include "tools/sim_options.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Vocabulary TestVocabulary() {
  return Vocabulary{{"dtr", "dtr-eq", "lru", "coop"}, {"counter", "arena"}, "dtr-eq", "counter", {"checkmate", "rotor"}};
}

absl::StatusOr<SimOptions> Parse(std::vector<std::string> args) { return ParseSimOptions(args, TestVocabulary()); }

// The error message for `args`, which must fail with InvalidArgument.
std::string Error(std::vector<std::string> args) {
  absl::StatusOr<SimOptions> options = Parse(args);
  EXPECT_FALSE(options.ok()) << "accepted: " << testing::PrintToString(args);
  if (options.ok()) return "";
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(options.status().message());
}

TEST(SimOptionsTest, DefaultsForOneTrace) {
  absl::StatusOr<SimOptions> options = Parse({"a.log"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->traces, ElementsAre("a.log"));
  ASSERT_EQ(options->ratios.size(), 9u);
  EXPECT_DOUBLE_EQ(options->ratios.front(), 0.9);
  EXPECT_DOUBLE_EQ(options->ratios.back(), 0.1);
  EXPECT_TRUE(options->budgets.empty());
  EXPECT_THAT(options->policies, ElementsAre("dtr-eq"));
  EXPECT_EQ(options->mode, "counter");
  EXPECT_DOUBLE_EQ(options->overhead_limit, 2.0);
  EXPECT_EQ(options->out_format, OutFormat::kNone);
  EXPECT_TRUE(options->plot.empty());
  EXPECT_EQ(options->jobs, 0);
  EXPECT_FALSE(options->dtr_paper);
  EXPECT_TRUE(options->cheap_tensor_partitioning);
  EXPECT_FALSE(options->sample_sqrt);
  EXPECT_THAT(options->offload, ElementsAre("off"));
  EXPECT_DOUBLE_EQ(options->bandwidth_bytes_per_s, 12e9);
  EXPECT_EQ(options->link_latency_ns, -1);  // the engine's default
  EXPECT_EQ(options->host_budget_bytes, 0u);
  EXPECT_FALSE(options->page_constants);
  EXPECT_FALSE(options->duplex_link);
  EXPECT_FALSE(options->foresight);
  absl::StatusOr<SimOptions> foresight = Parse({"a.log", "--foresight"});
  ASSERT_TRUE(foresight.ok()) << foresight.status();
  EXPECT_TRUE(foresight->foresight);
}

TEST(SimOptionsTest, PagingFlags) {
  absl::StatusOr<SimOptions> options =
      Parse({"a.log", "--offload", "off,auto,always", "--bandwidth=12GB/s", "--link-latency", "2.5us",
             "--host-budget", "64GiB", "--page-constants", "--duplex-link"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->offload, ElementsAre("off", "auto", "always"));
  EXPECT_DOUBLE_EQ(options->bandwidth_bytes_per_s, 12e9);
  EXPECT_EQ(options->link_latency_ns, 2500);
  EXPECT_EQ(options->host_budget_bytes, 64ull << 30);
  EXPECT_TRUE(options->page_constants);
  EXPECT_TRUE(options->duplex_link);
}

TEST(SimOptionsTest, BandwidthForms) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, double>>{
           {"12e9", 12e9}, {"12GB/s", 12e9}, {"12 GB/s", 12e9}, {"16GiB/s", 16.0 * (1ull << 30)},
           {"900MB", 900e6}, {"1.5e10/s", 1.5e10}, {"1000", 1000}}) {
    SCOPED_TRACE(text);
    absl::StatusOr<double> rate = ParseBandwidth(text);
    ASSERT_TRUE(rate.ok()) << rate.status();
    EXPECT_DOUBLE_EQ(*rate, expected);
  }
}

TEST(SimOptionsTest, DurationForms) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::int64_t>>{
           {"10us", 10000}, {"0.5ms", 500000}, {"250ns", 250}, {"1s", 1000000000}, {"0", 0}, {"0us", 0}}) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::int64_t> ns = ParseDuration(text);
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_EQ(*ns, expected);
  }
}

TEST(SimOptionsTest, MalformedPagingFlags) {
  std::string message = Error({"a.log", "--offload", "sometimes"});
  EXPECT_THAT(message, HasSubstr("--offload"));
  EXPECT_THAT(message, HasSubstr("unknown offload mode 'sometimes' (known: off, auto, always"));
  EXPECT_THAT(Error({"a.log", "--offload", "off,auto,off"}), HasSubstr("'off' is listed twice"));
  EXPECT_THAT(Error({"a.log", "--offload", "auto,"}), HasSubstr("empty element"));
  for (const char* bad : {"fast", "12GB/h", "0", "0GB/s", "-1e9", "nan", "inf", "12XB/s", "/s"}) {
    SCOPED_TRACE(bad);
    message = Error({"a.log", "--bandwidth", bad});
    EXPECT_THAT(message, HasSubstr("--bandwidth"));
    EXPECT_THAT(message, HasSubstr(std::string("'") + bad + "'"));
  }
  EXPECT_THAT(Error({"a.log", "--bandwidth", "fast"}), HasSubstr("e.g. 12GB/s, 12e9"));
  for (const char* bad : {"10", "10 parsecs", "us", "-1us", "1.5ns", "ten us"}) {
    SCOPED_TRACE(bad);
    message = Error({"a.log", "--link-latency", bad});
    EXPECT_THAT(message, HasSubstr("--link-latency"));
    EXPECT_THAT(message, HasSubstr(std::string("'") + bad + "'"));
  }
  EXPECT_THAT(Error({"a.log", "--link-latency", "10"}), HasSubstr("e.g. 10us, 0.5ms"));
  EXPECT_THAT(Error({"a.log", "--host-budget", "lots"}), HasSubstr("--host-budget"));
  EXPECT_THAT(Error({"a.log", "--host-budget", "0"}), HasSubstr("--host-budget: '0' is zero bytes"));
  EXPECT_THAT(Error({"a.log", "--duplex-link=yes"}), HasSubstr("--duplex-link: takes no value"));
  EXPECT_THAT(Error({"a.log", "--offload"}), HasSubstr("--offload: missing value"));
}

TEST(SimOptionsTest, EveryFlag) {
  absl::StatusOr<SimOptions> options =
      Parse({"a.log", "--ratios", "0.9,0.7,0.5", "b.log", "--policies=dtr-eq,coop", "--mode", "arena",
             "--overhead-limit", "3.5", "--out", "r.json", "--plot", "o.png", "--jobs", "3", "--seed", "7",
             "--sample-sqrt", "--ignore-small", "--dtr-paper", "--no-partition"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->traces, ElementsAre("a.log", "b.log"));
  EXPECT_THAT(options->ratios, ElementsAre(0.9, 0.7, 0.5));
  EXPECT_THAT(options->policies, ElementsAre("dtr-eq", "coop"));
  EXPECT_EQ(options->mode, "arena");
  EXPECT_DOUBLE_EQ(options->overhead_limit, 3.5);
  EXPECT_EQ(options->out, "r.json");
  EXPECT_EQ(options->out_format, OutFormat::kJson);
  EXPECT_EQ(options->plot, "o.png");
  EXPECT_EQ(options->jobs, 3);
  EXPECT_EQ(options->seed, 7u);
  EXPECT_TRUE(options->sample_sqrt);
  EXPECT_TRUE(options->ignore_small);
  EXPECT_TRUE(options->dtr_paper);
  EXPECT_FALSE(options->cheap_tensor_partitioning);
}

TEST(SimOptionsTest, RatioIsParsedExactlyAsWritten) {
  // The budget is int(ratio x peak), as in simrd: the ratio must be the same double Python makes of "0.7".
  absl::StatusOr<SimOptions> options = Parse({"a.log", "--ratios=0.7,1,1e-1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->ratios, ElementsAre(0.7, 1.0, 0.1));
}

TEST(SimOptionsTest, BudgetsWithUnits) {
  absl::StatusOr<SimOptions> options = Parse({"a.log", "--budgets", "4GiB,512MiB,1000"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->budgets, ElementsAre(4ull << 30, 512ull << 20, 1000ull));
  EXPECT_TRUE(options->ratios.empty());
}

TEST(SimOptionsTest, CsvOutput) {
  absl::StatusOr<SimOptions> options = Parse({"a.log", "--out", "dir/results.csv"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->out_format, OutFormat::kCsv);
}

TEST(SimOptionsTest, HelpNeedsNoTrace) {
  absl::StatusOr<SimOptions> options = Parse({"--help"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->help);
  options = Parse({"-h"});
  ASSERT_TRUE(options.ok());
  EXPECT_TRUE(options->help);
}

TEST(SimOptionsTest, DoubleDashEndsFlags) {
  absl::StatusOr<SimOptions> options = Parse({"--ratios", "0.5", "--", "--odd-name.log"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->traces, ElementsAre("--odd-name.log"));
}

TEST(SimOptionsTest, UnknownPolicyNamesItAndTheKnownOnes) {
  const std::string message = Error({"a.log", "--policies", "dtr-eq,dtr_eq"});
  EXPECT_THAT(message, HasSubstr("unknown policy 'dtr_eq'"));
  EXPECT_THAT(message, HasSubstr("dtr, dtr-eq, lru, coop"));
}

TEST(SimOptionsTest, UnknownMode) {
  EXPECT_THAT(Error({"a.log", "--mode", "arenas"}), HasSubstr("unknown mode 'arenas' (known: counter, arena)"));
}

TEST(SimOptionsTest, MalformedRatios) {
  EXPECT_THAT(Error({"a.log", "--ratios", "0.9,0.x"}), HasSubstr("'0.x' is not a number"));
  EXPECT_THAT(Error({"a.log", "--ratios", "nan"}), HasSubstr("'nan' is not a number"));
  EXPECT_THAT(Error({"a.log", "--ratios", "inf"}), HasSubstr("'inf' is not a number"));
  EXPECT_THAT(Error({"a.log", "--ratios", "0x1p-1"}), HasSubstr("not a number"));
  EXPECT_THAT(Error({"a.log", "--ratios", "1.5"}), HasSubstr("out of range"));
  EXPECT_THAT(Error({"a.log", "--ratios", "0"}), HasSubstr("out of range"));
  EXPECT_THAT(Error({"a.log", "--ratios", "-0.5"}), HasSubstr("out of range"));
  EXPECT_THAT(Error({"a.log", "--ratios", "0.9,,0.5"}), HasSubstr("empty element"));
  EXPECT_THAT(Error({"a.log", "--ratios", "0.5,"}), HasSubstr("empty element"));
  EXPECT_THAT(Error({"a.log", "--ratios", ""}), HasSubstr("--ratios: expects a comma-separated list, got an empty"));
  EXPECT_THAT(Error({"a.log", "--ratios="}), HasSubstr("--ratios: missing value"));  // CLI11: "=" with nothing after
  EXPECT_THAT(Error({"a.log", "--ratios", "0.5,0.50"}), HasSubstr("repeats a ratio"));
}

TEST(SimOptionsTest, MalformedBudgets) {
  const std::string message = Error({"a.log", "--budgets", "4XB"});
  EXPECT_THAT(message, HasSubstr("--budgets"));
  EXPECT_THAT(message, HasSubstr("4XB"));
  EXPECT_THAT(Error({"a.log", "--budgets", "0"}), HasSubstr("zero bytes"));
  EXPECT_THAT(Error({"a.log", "--budgets", "1GiB,1024MiB"}), HasSubstr("repeats a budget"));
  // It used to wrap to a negative budget and run at the trace's peak while the ratio column said 916,728,735.
  EXPECT_THAT(Error({"a.log", "--budgets", "9223372036854775807"}), HasSubstr("above 8 PiB"));
  EXPECT_THAT(Error({"a.log", "--host-budget", "9223372036854775807"}), HasSubstr("above 8 PiB"));
}

TEST(SimOptionsTest, RatiosAndBudgetsExcludeEachOther) {
  EXPECT_THAT(Error({"a.log", "--ratios", "0.5", "--budgets", "1GiB"}), HasSubstr("exclude each other"));
}

TEST(SimOptionsTest, UnknownFlagsAndMissingValues) {
  EXPECT_THAT(Error({"a.log", "--ratio", "0.5"}), HasSubstr("unknown option '--ratio'"));
  EXPECT_THAT(Error({"a.log", "-r"}), HasSubstr("unknown option '-r'"));
  EXPECT_THAT(Error({"a.log", "--ratios"}), HasSubstr("--ratios: missing value"));
  EXPECT_THAT(Error({"a.log", "--sample-sqrt=yes"}), HasSubstr("--sample-sqrt: takes no value"));
}

TEST(SimOptionsTest, OtherValues) {
  EXPECT_THAT(Error({"a.log", "--out", "results.txt"}), HasSubstr("must end in .csv or .json"));
  EXPECT_THAT(Error({"a.log", "--out", ".csv"}), HasSubstr("must end in .csv or .json"));
  EXPECT_THAT(Error({"a.log", "--plot", "overhead.jpg"}), HasSubstr("must end in .png"));
  EXPECT_THAT(Error({"a.log", "--timeline", "run.csv"}), HasSubstr("'run.csv' must end in .png or .json"));
  EXPECT_THAT(Error({"a.log", "--timeline", ".json"}), HasSubstr("must end in .png or .json"));
  absl::StatusOr<SimOptions> timeline = ParseSimOptions({"a.log", "--timeline=run.json"}, TestVocabulary());
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  EXPECT_EQ(timeline->timeline, "run.json");
  EXPECT_THAT(Error({"a.log", "--jobs", "-1"}), HasSubstr("--jobs"));
  EXPECT_THAT(Error({"a.log", "--jobs", "two"}), HasSubstr("'two' is not an integer"));
  EXPECT_THAT(Error({"a.log", "--overhead-limit", "inf"}), HasSubstr("not a finite number"));
  EXPECT_THAT(Error({"a.log", "--seed", "-3"}), HasSubstr("--seed"));
}

TEST(SimOptionsTest, TraceGivenTwice) {
  EXPECT_THAT(Error({"a.log", "b.log", "a.log"}), HasSubstr("'a.log' is given twice"));
}

TEST(SimOptionsTest, NoTrace) { EXPECT_THAT(Error({"--ratios", "0.5"}), HasSubstr("no trace file given")); }

TEST(SimOptionsTest, UsageListsPoliciesModesAndFlags) {
  const std::string usage = UsageText("remat-sim", TestVocabulary());
  EXPECT_THAT(usage, HasSubstr("usage: remat-sim TRACE..."));
  EXPECT_THAT(usage, HasSubstr("dtr, dtr-eq, lru, coop"));
  EXPECT_THAT(usage, HasSubstr("counter, arena"));
  for (const char* flag : {"--ratios", "--budgets", "--policies", "--mode", "--overhead-limit", "--out", "--plot",
                           "--timeline", "--jobs", "--seed", "--offload", "--bandwidth", "--link-latency", "--host-budget",
                           "--page-constants", "--duplex-link", "--help"}) {
    EXPECT_THAT(usage, HasSubstr(flag));
  }
}

TEST(SimOptionsTest, PlannerFlags) {
  absl::StatusOr<SimOptions> o = Parse({"t.log", "--planner", "checkmate", "--planner-time-limit", "5min",
                                        "--planner-max-binaries", "1000", "--segment", "10+200"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->planners, std::vector<std::string>{"checkmate"});
  EXPECT_DOUBLE_EQ(o->planner_time_limit_s, 300);
  EXPECT_EQ(o->planner_max_binaries, 1000);
  EXPECT_EQ(o->segment_first, 10);
  EXPECT_EQ(o->segment_count, 200);
  EXPECT_DOUBLE_EQ(Parse({"t.log", "--planner-time-limit", "90s"})->planner_time_limit_s, 90);
  EXPECT_EQ(Parse({"t.log"})->segment_first, -1);
  EXPECT_THAT(Parse({"t.log", "--planner", "pofo"}).status().message(), HasSubstr("unknown planner 'pofo'"));
  EXPECT_EQ(Parse({"t.log", "--planner", "checkmate,rotor"})->planners,
            (std::vector<std::string>{"checkmate", "rotor"}));
  EXPECT_THAT(Parse({"t.log", "--planner", "rotor,rotor"}).status().message(), HasSubstr("listed twice"));
  EXPECT_THAT(Parse({"t.log", "--planner-time-limit", "0"}).status().message(), HasSubstr("--planner-time-limit"));
  EXPECT_THAT(Parse({"t.log", "--segment", "10"}).status().message(), HasSubstr("FIRST+COUNT"));
  EXPECT_THAT(Parse({"t.log", "--segment", "5+0"}).status().message(), HasSubstr("FIRST+COUNT"));
  EXPECT_FALSE(Parse({"t.log", "--planner-max-binaries", "-3"}).ok());
}

}  // namespace
}  // namespace remat::sim
