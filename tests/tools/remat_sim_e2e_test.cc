// End to end: runs the built remat-sim program (REMAT_SIM_BINARY) as a user would and checks its exit status,
// stdout, stderr and output files. Small synthetic traces pin the tool's arithmetic (budgets, baseline, one
// rematerialization); one real trace from $REMAT_SHARED_DIR/traces/dtr is checked against simrd's numbers.
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tools/plan_traces.h"

namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kResnet[] = "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class RematSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "remat-sim-e2e-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string File(const std::string& name) const { return dir_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(File(name)) << text;
    return File(name);
  }

  // Runs remat-sim with `args` (each single-quoted for the shell); fills out_ and err_, returns the exit status.
  // `stdout_path`: where its standard output goes (default: a file read into out_).
  int Run(const std::vector<std::string>& args, const std::string& stdout_path = "") {
    std::string command = absl::StrCat("'", REMAT_SIM_BINARY, "'");
    for (const std::string& arg : args) absl::StrAppend(&command, " '", arg, "'");
    absl::StrAppend(&command, " >'", stdout_path.empty() ? File("stdout") : stdout_path, "' 2>'", File("stderr"), "'");
    const int status = std::system(command.c_str());
    out_ = ReadFile(File("stdout"));
    err_ = ReadFile(File("stderr"));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // The CSV as rows of column -> value.
  static std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
    std::vector<std::string> lines = absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty());
    std::vector<std::map<std::string, std::string>> rows;
    if (lines.empty()) return rows;
    std::vector<std::string> header = absl::StrSplit(lines[0], ',');
    for (std::size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> cells = absl::StrSplit(lines[i], ',');  // no quoted fields in these tests
      std::map<std::string, std::string> row;
      for (std::size_t c = 0; c < header.size() && c < cells.size(); ++c) row[header[c]] = cells[c];
      rows.push_back(row);
    }
    return rows;
  }

  static double Number(const std::map<std::string, std::string>& row, const std::string& column) {
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(row.at(column), &value)) << column << "='" << row.at(column) << "'";
    return value;
  }

  // The shared reference data; fails (never skips) when the environment does not provide it.
  static std::string SharedTrace(const std::string& name) {
    const char* shared = std::getenv("REMAT_SHARED_DIR");
    EXPECT_NE(shared, nullptr) << "REMAT_SHARED_DIR is not set (remat_test sets it to the shared data folder)";
    if (shared == nullptr) return "";
    const std::string path = absl::StrCat(shared, "/traces/dtr/", name);
    EXPECT_TRUE(std::filesystem::is_regular_file(path)) << path << " is missing";
    return path;
  }

  std::string dir_;
  std::string out_;
  std::string err_;
};

// w is a constant; x1..x4 a chain of 1000-byte results, each op 1 ms; x2, x3 released; y = g(x4, x1).
// Unconstrained peak: w + x1..x4 = 5000 bytes. At 4000 bytes x1 must be evicted for x4 and recomputed once for
// y (overhead 6/5); at 3000 bytes y cannot be placed next to its locked inputs (oom).
constexpr char kChain[] = R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"1000","NAME":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["x1"],"TIME":"1000000"}
{"INSTRUCTION":"MEMORY","MEMORY":"1000","NAME":"x1"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x1"}
{"ARGS":["x1"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["x2"],"TIME":"1000000"}
{"INSTRUCTION":"MEMORY","MEMORY":"1000","NAME":"x2"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x2"}
{"ARGS":["x2"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["x3"],"TIME":"1000000"}
{"INSTRUCTION":"MEMORY","MEMORY":"1000","NAME":"x3"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x3"}
{"ARGS":["x3"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["x4"],"TIME":"1000000"}
{"INSTRUCTION":"MEMORY","MEMORY":"1000","NAME":"x4"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x4"}
{"INSTRUCTION":"RELEASE","NAME":"x2"}
{"INSTRUCTION":"RELEASE","NAME":"x3"}
{"ARGS":["x4","x1"],"INSTRUCTION":"CALL","NAME":"g","RESULT":["y"],"TIME":"1000000"}
{"INSTRUCTION":"MEMORY","MEMORY":"1000","NAME":"y"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"y"}
{"INSTRUCTION":"RELEASE","NAME":"x1"}
{"INSTRUCTION":"RELEASE","NAME":"x4"}
)";

TEST_F(RematSimTest, SyntheticChainUnderThreeBudgetsAndTwoPolicies) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "1,0.8,0.6", "--policies", "dtr-eq,lru", "--out", File("r.csv"), "--jobs",
                 "2"}),
            0)
      << err_;
  EXPECT_THAT(err_, IsEmpty());  // stderr is not a terminal: no progress bar
  const auto rows = ReadCsv(File("r.csv"));
  ASSERT_EQ(rows.size(), 6u);
  const std::vector<std::string> expected_ratio = {"1", "0.8", "0.6", "1", "0.8", "0.6"};
  const std::vector<std::string> expected_result = {"pass", "pass", "oom", "pass", "pass", "oom"};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(rows[i].at("trace"), "chain.log");
    EXPECT_EQ(rows[i].at("policy"), i < 3 ? "dtr-eq" : "lru");  // rows in command-line order
    EXPECT_EQ(rows[i].at("mode"), "counter");
    EXPECT_EQ(rows[i].at("ratio"), expected_ratio[i]);
    EXPECT_EQ(rows[i].at("baseline_memory_bytes"), "5000");
    EXPECT_EQ(rows[i].at("baseline_compute_ns"), "5000000");
    EXPECT_EQ(rows[i].at("result"), expected_result[i]);
    EXPECT_EQ(rows[i].at("fragmentation_rate"), "");  // counter mode
  }
  EXPECT_EQ(rows[0].at("budget_bytes"), "5000");
  EXPECT_EQ(rows[1].at("budget_bytes"), "4000");
  EXPECT_EQ(rows[2].at("budget_bytes"), "3000");
  EXPECT_DOUBLE_EQ(Number(rows[0], "overhead"), 1.0);
  EXPECT_EQ(rows[0].at("evictions"), "0");
  EXPECT_EQ(rows[0].at("peak_bytes"), "5000");
  EXPECT_DOUBLE_EQ(Number(rows[1], "overhead"), 1.2);
  EXPECT_EQ(rows[1].at("rematerializations"), "1");
  EXPECT_EQ(rows[1].at("replayed_cost_ns"), "1000000");
  EXPECT_LE(Number(rows[1], "peak_bytes"), 4000);
  // The table on stdout: a header and one line per row.
  std::vector<std::string> lines = absl::StrSplit(out_, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u) << out_;
  EXPECT_THAT(lines[0], HasSubstr("overhead"));
  EXPECT_THAT(lines[2], HasSubstr("1.2000"));
  EXPECT_THAT(lines[3], HasSubstr("oom"));
}

// --planner: at 4000 bytes the optimum frees x2 after its last read (nothing replays: 1.0) where both policies
// replay x1 (1.2); at 3000 bytes no schedule fits (y with its inputs and w needs 4000): the planner proves it.
TEST_F(RematSimTest, PlannerPrintsTheOptimumNextToThePolicies) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "0.8,0.6", "--policies", "dtr-eq,lru", "--planner", "checkmate", "--out",
                 File("p.csv"), "--jobs", "1"}),
            0)
      << err_;
  EXPECT_THAT(out_, HasSubstr("Offline optimum (checkmate"));
  const auto rows = ReadCsv(File("p.csv"));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[4].at("policy"), "opt-checkmate");
  EXPECT_EQ(rows[4].at("ratio"), "0.8");
  EXPECT_EQ(rows[4].at("result"), "optimal");
  EXPECT_DOUBLE_EQ(Number(rows[4], "overhead"), 1.0);
  EXPECT_DOUBLE_EQ(Number(rows[0], "overhead"), 1.2);  // dtr-eq at 0.8
  EXPECT_EQ(rows[5].at("result"), "infeasible");
  // Bad planner input: an unknown name, and accounting the planner does not model.
  EXPECT_EQ(Run({trace, "--planner", "gurobi"}), 2);
  EXPECT_THAT(err_, HasSubstr("unknown planner 'gurobi'"));
  EXPECT_EQ(Run({trace, "--planner", "checkmate", "--mode", "arena"}), 2);
  EXPECT_THAT(err_, HasSubstr("counter mode"));
  // A model above the size limit is refused with advice, not solved for ever.
  ASSERT_EQ(Run({trace, "--ratios", "0.8", "--planner", "checkmate", "--planner-max-binaries", "2"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("too-big"));
  EXPECT_THAT(out_, HasSubstr("--segment"));
}

// --planner checkmate,rotor with --offload off,auto: per budget a drop-only ILP plan, Rotor's plan (kChain is a
// chain of 2 stages: x1, then x2..x4, g reading x4 and x1), the joint drop-or-page plan, and a Rotor row that says
// it does not page. Bad combinations are refused with the reason.
TEST_F(RematSimTest, EveryPlannerPrintsItsPlanWithAndWithoutPaging) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "0.8", "--policies", "dtr-eq", "--offload", "off,auto", "--planner",
                 "checkmate,rotor", "--out", File("p.csv"), "--jobs", "1"}),
            0)
      << err_;
  const auto rows = ReadCsv(File("p.csv"));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[2].at("policy"), "opt-checkmate");
  EXPECT_EQ(rows[3].at("policy"), "opt-rotor");
  EXPECT_EQ(rows[4].at("policy"), "opt-checkmate+page");
  EXPECT_EQ(rows[5].at("policy"), "opt-rotor+page");
  EXPECT_EQ(rows[2].at("result"), "optimal");
  EXPECT_EQ(rows[3].at("result"), "optimal");
  EXPECT_DOUBLE_EQ(Number(rows[3], "overhead"), Number(rows[2], "overhead"));
  EXPECT_DOUBLE_EQ(Number(rows[2], "overhead"), 1.0);
  EXPECT_LE(Number(rows[4], "overhead"), Number(rows[2], "overhead"));
  EXPECT_EQ(rows[5].at("result"), "n/a");
  EXPECT_THAT(out_, HasSubstr("rotor plans drop-only"));
  // A trace that is not a chain: its Rotor row says why.
  const std::string pair = Write("pair.log", remat::plan::testing::TrainingTrace(1));  // 2 ops: 1 stage
  ASSERT_EQ(Run({pair, "--ratios", "0.9", "--planner", "rotor", "--jobs", "1"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("not-chain"));
  EXPECT_THAT(out_, HasSubstr("not a chain"));
  // Bad flags.
  EXPECT_EQ(Run({trace, "--planner", "rotor,rotor"}), 2);
  EXPECT_THAT(err_, HasSubstr("listed twice"));
  EXPECT_EQ(Run({trace, "--planner", "checkmate,pofo"}), 2);
  EXPECT_THAT(err_, HasSubstr("unknown planner 'pofo'"));
  EXPECT_EQ(Run({trace, "--planner", "checkmate", "--offload", "auto", "--page-constants"}), 2);
  EXPECT_THAT(err_, HasSubstr("never pages constants"));
  EXPECT_EQ(Run({trace, "--planner", "rotor", "--dtr-paper"}), 2);
  EXPECT_THAT(err_, HasSubstr("--dtr-paper"));
}

TEST_F(RematSimTest, OffloadAutoBeatsRecomputingACostlyChain) {
  // At 4000 bytes x1 must leave the device for x4. Without paging it is recomputed (1 ms, overhead 1.2); with
  // auto, 1000 bytes over a 12 GB/s link with 10 us latency cost far less than the 1 ms op, so it is paged out and
  // back in, and the overhead is what the transfers could not hide.
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "0.8", "--policies", "dtr-eq", "--offload", "off,auto", "--bandwidth", "12GB/s",
                 "--out", File("r.csv")}),
            0)
      << err_;
  const auto rows = ReadCsv(File("r.csv"));
  ASSERT_EQ(rows.size(), 2u);  // one row per offload mode, in command-line order
  EXPECT_EQ(rows[0].at("offload"), "off");
  EXPECT_EQ(rows[1].at("offload"), "auto");
  for (const auto& row : rows) EXPECT_EQ(row.at("result"), "pass");
  EXPECT_DOUBLE_EQ(Number(rows[0], "overhead"), 1.2);
  EXPECT_LT(Number(rows[1], "overhead"), Number(rows[0], "overhead"));
  EXPECT_GE(Number(rows[1], "overhead"), 1.0);
  // Byte columns: zero without paging, non-zero with it.
  for (const char* column : {"paged_out_bytes", "paged_in_bytes", "page_outs", "page_ins", "transfer_stall_ns"}) {
    EXPECT_EQ(rows[0].at(column), "0") << column;
  }
  EXPECT_GE(Number(rows[1], "paged_out_bytes"), 1000);
  EXPECT_GE(Number(rows[1], "paged_in_bytes"), 1000);
  EXPECT_GE(Number(rows[1], "page_outs"), 1);
  EXPECT_GE(Number(rows[1], "page_ins"), 1);
  EXPECT_EQ(rows[1].at("rematerializations"), "0");
  // The table shows the mode and the paging columns.
  std::vector<std::string> lines = absl::StrSplit(out_, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << out_;
  EXPECT_THAT(lines[0], HasSubstr("offload"));
  EXPECT_THAT(lines[0], HasSubstr("paged out"));
  EXPECT_THAT(lines[0], HasSubstr("stall ms"));
  EXPECT_THAT(lines[2], HasSubstr(" auto "));
}

TEST_F(RematSimTest, OffloadColumnsInJson) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--budgets", "4000", "--offload", "auto", "--link-latency", "0", "--duplex-link",
                 "--host-budget", "1MiB", "--out", File("r.json")}),
            0)
      << err_;
  const std::string json = ReadFile(File("r.json"));
  EXPECT_THAT(json, HasSubstr("\"offload\": \"auto\""));
  EXPECT_THAT(json, HasSubstr("\"paged_out_bytes\": "));
  EXPECT_THAT(json, Not(HasSubstr("\"paged_out_bytes\": 0,")));
  EXPECT_THAT(json, HasSubstr("\"transfer_stall_ns\": "));
}

TEST_F(RematSimTest, AbsoluteBudgetsAndJson) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--budgets", "4000,3000", "--out", File("r.json")}), 0) << err_;
  const std::string json = ReadFile(File("r.json"));
  EXPECT_THAT(json, HasSubstr("\"ratio\": 0.8, \"budget_bytes\": 4000, \"result\": \"pass\", \"overhead\": 1.2,"));
  EXPECT_THAT(json, HasSubstr("\"ratio\": 0.6, \"budget_bytes\": 3000, \"result\": \"oom\""));
}

TEST_F(RematSimTest, ArenaModeReportsFragmentation) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "1", "--policies", "coop", "--mode", "arena", "--out", File("r.csv")}), 0)
      << err_;
  const auto rows = ReadCsv(File("r.csv"));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("mode"), "arena");
  EXPECT_EQ(rows[0].at("result"), "pass");
  EXPECT_NE(rows[0].at("fragmentation_rate"), "");
}

TEST_F(RematSimTest, StitchModeRowsSayStitchAndBadGranulesAreCommandLineErrors) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "1", "--policies", "dtr-eq", "--mode", "stitch", "--granule", "4KiB", "--out",
                 File("r.csv")}),
            0)
      << err_;
  const auto rows = ReadCsv(File("r.csv"));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("mode"), "stitch");
  EXPECT_EQ(rows[0].at("result"), "pass");
  EXPECT_EQ(Run({trace, "--mode", "stitch", "--granule", "3000"}), 2);
  EXPECT_THAT(err_, HasSubstr("--granule: the granule must be a power of two"));
  EXPECT_EQ(Run({trace, "--mode", "stitch", "--granule", "lots"}), 2);
  EXPECT_THAT(err_, HasSubstr("--granule"));
}

TEST_F(RematSimTest, MalformedTraceNamesFileAndLine) {
  const std::string trace = Write("bad.log",
                                  "{\"ANNOTATION\":\"START\",\"INSTRUCTION\":\"ANNOTATE\"}\n"
                                  "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"w\"}\n"
                                  "{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"1000\",\"NAME\":\"w\"}\n"
                                  "{\"ARGS\":[\"w\"],\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\"\n");
  EXPECT_EQ(Run({trace, "--ratios", "0.5"}), 1);
  EXPECT_THAT(err_, HasSubstr(trace + ":4:"));
  EXPECT_THAT(out_, IsEmpty());
}

TEST_F(RematSimTest, UnknownNameInArgsNamesFileAndLine) {
  const std::string trace = Write("unknown.log",
                                  "{\"ANNOTATION\":\"START\",\"INSTRUCTION\":\"ANNOTATE\"}\n"
                                  "{\"ARGS\":[\"nobody\"],\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\",\"RESULT\":[\"x\"],"
                                  "\"TIME\":\"5\"}\n"
                                  "{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"8\",\"NAME\":\"x\"}\n"
                                  "{\"ALIAS\":\"-1\",\"INSTRUCTION\":\"ALIAS\",\"NAME\":\"x\"}\n");
  EXPECT_EQ(Run({trace}), 1);
  EXPECT_THAT(err_, HasSubstr(trace + ":2:"));
  EXPECT_THAT(err_, HasSubstr("nobody"));
}

TEST_F(RematSimTest, CommandLineErrorsExitWithTwo) {
  const std::string trace = Write("chain.log", kChain);
  EXPECT_EQ(Run({File("missing.log")}), 2);
  EXPECT_THAT(err_, HasSubstr("trace file '" + File("missing.log") + "' not found"));
  EXPECT_EQ(Run({trace, "--policies", "dtr-eq,nosuch"}), 2);
  EXPECT_THAT(err_, HasSubstr("unknown policy 'nosuch'"));
  EXPECT_EQ(Run({trace, "--ratios", "0.5,half"}), 2);
  EXPECT_THAT(err_, HasSubstr("'half' is not a number"));
  EXPECT_EQ(Run({trace, "--frobnicate"}), 2);
  EXPECT_THAT(err_, HasSubstr("unknown option '--frobnicate'"));
  EXPECT_EQ(Run({trace, "--budgets", "12 parsecs"}), 2);
  EXPECT_THAT(err_, HasSubstr("--budgets"));
  EXPECT_EQ(Run({trace, "--offload", "maybe"}), 2);
  EXPECT_THAT(err_, HasSubstr("--offload: unknown offload mode 'maybe' (known: off, auto, always"));
  EXPECT_EQ(Run({trace, "--bandwidth", "fast"}), 2);
  EXPECT_THAT(err_, HasSubstr("--bandwidth: 'fast' is not a rate; expected"));
  EXPECT_EQ(Run({trace, "--link-latency", "10"}), 2);
  EXPECT_THAT(err_, HasSubstr("--link-latency: '10' has no unit"));
  EXPECT_EQ(Run({trace, "--host-budget", "0"}), 2);
  EXPECT_THAT(err_, HasSubstr("--host-budget"));
  EXPECT_THAT(out_, IsEmpty());
}

// /dev/full fails every write with ENOSPC, as a full disk does: the results are lost, and the run says so.
TEST_F(RematSimTest, OutputOnAFullDiskExitsWithOneNamingTheCause) {
  const std::string trace = Write("chain.log", kChain);
  const std::string full_csv = File("full.csv");  // --out wants .csv or .json
  std::filesystem::create_symlink("/dev/full", full_csv);
  EXPECT_EQ(Run({trace, "--budgets", "4000", "--out", full_csv}), 1);
  EXPECT_THAT(err_,
              HasSubstr("failed writing '" + full_csv + "' (No space left on device); the results are incomplete"));
  EXPECT_EQ(Run({trace, "--budgets", "4000"}, "/dev/full"), 1);
  EXPECT_THAT(err_, HasSubstr("cannot write the table to standard output: No space left on device"));
}

TEST_F(RematSimTest, HelpListsTheEnginePolicies) {
  ASSERT_EQ(Run({"--help"}), 0);
  for (const char* policy : {"dtr", "dtr-eq", "dtr-local", "msps", "lru", "largest", "random", "dte", "coop"}) {
    EXPECT_THAT(out_, HasSubstr(policy));
  }
}

TEST_F(RematSimTest, RealTraceMatchesSimrd) {
  // simrd on ResNet-32 with DTREqClass at ratio 0.5: pass, overhead 1.1068, baseline peak 10061179152 bytes,
  // budget 5030589576 bytes (simrd_reference.csv).
  const std::string trace = SharedTrace(kResnet);
  ASSERT_FALSE(trace.empty());
  ASSERT_EQ(Run({trace, "--ratios", "0.5", "--policies", "dtr-eq", "--out", File("r.csv")}), 0) << err_;
  const auto rows = ReadCsv(File("r.csv"));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("trace"), kResnet);
  EXPECT_EQ(rows[0].at("result"), "pass");
  EXPECT_EQ(rows[0].at("baseline_memory_bytes"), "10061179152");
  EXPECT_EQ(rows[0].at("baseline_compute_ns"), "291905487");
  EXPECT_EQ(rows[0].at("budget_bytes"), "5030589576");
  EXPECT_NEAR(Number(rows[0], "overhead"), 1.1068, 1.1068 * 0.01);
  EXPECT_GT(Number(rows[0], "evictions"), 0);
}

TEST_F(RematSimTest, PlotFromARealTrace) {
  const std::string trace = SharedTrace(kResnet);
  ASSERT_FALSE(trace.empty());
  // JSON output, so the plot goes through the temporary CSV.
  ASSERT_EQ(Run({trace, "--ratios", "0.9,0.5,0.3", "--policies", "dtr-eq,msps", "--out", File("r.json"), "--plot",
                 File("o.png")}),
            0)
      << err_;
  const std::string png = ReadFile(File("o.png"));
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

// --timeline: one run's memory over time as remat.trace's JSON counters, then (for .png) drawn by remat/plot.py.
TEST_F(RematSimTest, TimelineOfOneRun) {
  const std::string trace = Write("chain.log", kChain);
  ASSERT_EQ(Run({trace, "--ratios", "0.8", "--timeline", File("t.json")}), 0) << err_;
  const std::string json = ReadFile(File("t.json"));
  EXPECT_THAT(json, HasSubstr(R"("producer": "remat")"));
  EXPECT_THAT(json, HasSubstr("\"name\": \"memory (bytes)\""));
  EXPECT_THAT(json, HasSubstr(R"("cat": "replay")"));  // the chain replays one op at 0.8 of its peak
  const std::string last = json.substr(json.rfind(R"("rematerialized": )"));
  EXPECT_THAT(last, Not(HasSubstr(R"("rematerialized": 0})")));

  const std::string real = SharedTrace(kResnet);
  ASSERT_FALSE(real.empty());
  ASSERT_EQ(Run({real, "--ratios", "0.5", "--mode", "arena", "--timeline", File("t.png")}), 0) << err_;
  const std::string png = ReadFile(File("t.png"));
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_TRUE(std::filesystem::exists(File("t.json")));

  EXPECT_EQ(Run({trace, "--ratios", "0.5,0.4", "--timeline", File("t.json")}), 2);
  EXPECT_THAT(err_, HasSubstr("--timeline draws one run"));
}

TEST_F(RematSimTest, PlotWithoutMatplotlibSaysSo) {
  const std::string trace = Write("chain.log", kChain);
  const std::string fake = Write("fake-python", "#!/bin/sh\nexit 3\n");
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  ::setenv("REMAT_PYTHON", fake.c_str(), 1);
  const int status = Run({trace, "--ratios", "1", "--plot", File("o.png")});
  ::unsetenv("REMAT_PYTHON");
  EXPECT_EQ(status, 1);
  EXPECT_THAT(err_, HasSubstr("matplotlib is not available to '" + fake + "'"));
}

}  // namespace
