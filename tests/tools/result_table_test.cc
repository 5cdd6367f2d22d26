#include "tools/result_table.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

SimRow CounterRow() {
  SimRow row;
  row.trace = "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log";
  row.policy = "dtr-eq";
  row.mode = "counter";
  row.ratio = 0.5;
  row.budget_bytes = 5030563868;
  row.result = "pass";
  row.overhead = 1.0123456789;
  row.peak_bytes = 5030000000;
  row.replayed_cost_ns = 3600000;
  row.evictions = 120;
  row.rematerializations = 80;
  row.heuristic_evaluations = 5000;
  row.search_time_ns = 250000;
  row.fragmentation_rate = 0.25;  // not written in counter mode
  row.wall_time_ns = 1500000;
  row.baseline_compute_ns = 291900000;
  row.baseline_memory_bytes = 10061127736;
  row.total_compute_ns = 295500000;
  return row;
}

SimRow ArenaOomRow() {
  SimRow row = CounterRow();
  row.trace = "unet-6-8000000000.0-2020-10-1-10-57-18-default.log";
  row.policy = "coop";
  row.mode = "arena";
  row.ratio = 0.1;
  row.result = "oom";
  row.fragmentation_rate = 0.125;
  row.message = "requested 1,024 bytes; \"locked\"\nline two";
  row.offload = "auto";
  row.paged_out_bytes = 3 << 20;
  row.paged_in_bytes = 1 << 20;
  row.page_outs = 3;
  row.page_ins = 1;
  row.transfer_stall_ns = 300000;
  return row;
}

TEST(ResultTableTest, TraceFileNameDropsTheDirectory) {
  EXPECT_EQ(TraceFileName("/a/b/x-1.log"), "x-1.log");
  EXPECT_EQ(TraceFileName("x-1.log"), "x-1.log");
}

TEST(ResultTableTest, CsvHeaderAndRows) {
  std::ostringstream out;
  WriteCsv({CounterRow(), ArenaOomRow()}, out);
  const std::string csv = out.str();
  std::vector<std::string> lines = absl::StrSplit(csv, '\n');
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[0], absl::StrJoin(CsvColumns(), ","));
  EXPECT_EQ(lines[1],
            "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log,dtr-eq,counter,off,0.5,5030563868,pass,1.01235,"
            "5030000000,3600000,120,80,5000,250000,,1500000,291900000,10061127736,295500000,0,0,0,0,0,");
  // The arena row: fragmentation written, the message quoted with its quotes doubled and its newline kept.
  EXPECT_EQ(lines[2],
            "unet-6-8000000000.0-2020-10-1-10-57-18-default.log,coop,arena,auto,0.1,5030563868,oom,1.01235,5030000000,"
            "3600000,120,80,5000,250000,0.125,1500000,291900000,10061127736,295500000,3145728,1048576,3,1,300000,"
            "\"requested 1,024 bytes; \"\"locked\"\"");
  EXPECT_EQ(lines[3], "line two\"");
  EXPECT_EQ(csv.back(), '\n');
}

TEST(ResultTableTest, CsvHasOneColumnPerField) {
  EXPECT_EQ(CsvColumns().size(), 25u);
  std::ostringstream out;
  WriteCsv({CounterRow()}, out);
  std::vector<std::string> lines = absl::StrSplit(out.str(), '\n');
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[1], ',')).size(), CsvColumns().size());
}

TEST(ResultTableTest, Json) {
  std::ostringstream out;
  WriteJson({CounterRow(), ArenaOomRow()}, out);
  const std::string json = out.str();
  EXPECT_EQ(json.front(), '[');
  EXPECT_THAT(json, HasSubstr("\"trace\": \"resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log\""));
  EXPECT_THAT(json, HasSubstr("\"ratio\": 0.5, \"budget_bytes\": 5030563868, \"result\": \"pass\", "
                              "\"overhead\": 1.01235"));
  EXPECT_THAT(json, HasSubstr("\"fragmentation_rate\": null"));
  EXPECT_THAT(json, HasSubstr("\"fragmentation_rate\": 0.125"));
  EXPECT_THAT(json, HasSubstr("\"mode\": \"counter\", \"offload\": \"off\", \"ratio\": 0.5"));
  EXPECT_THAT(json, HasSubstr("\"paged_out_bytes\": 3145728, \"paged_in_bytes\": 1048576, \"page_outs\": 3, "
                              "\"page_ins\": 1, \"transfer_stall_ns\": 300000, \"message\""));
  EXPECT_THAT(json, HasSubstr("\"paged_out_bytes\": 0, \"paged_in_bytes\": 0, \"page_outs\": 0"));
  EXPECT_THAT(json, HasSubstr("\"message\": \"requested 1,024 bytes; \\\"locked\\\"\\nline two\""));
  EXPECT_EQ(json.substr(json.size() - 4), "}\n]\n");
}

TEST(ResultTableTest, JsonEscapesControlCharacters) {
  SimRow row = CounterRow();
  row.message = std::string("a\x01" "b\\");
  std::ostringstream out;
  WriteJson({row}, out);
  EXPECT_THAT(out.str(), HasSubstr("\"message\": \"a\\u0001b\\\\\""));
}

TEST(ResultTableTest, EmptyJsonIsAnEmptyArray) {
  std::ostringstream out;
  WriteJson({}, out);
  EXPECT_EQ(out.str(), "[]\n");
}

TEST(ResultTableTest, TableIsAligned) {
  const std::string table = FormatTable({CounterRow(), ArenaOomRow()});
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  // Every line has the same width (the last column is right-aligned), so every column lines up.
  EXPECT_EQ(lines[0].size(), lines[1].size());
  EXPECT_EQ(lines[0].size(), lines[2].size());
  // Right-aligned numbers end where their header ends.
  const std::size_t overhead_end = lines[0].find("overhead") + std::string("overhead").size();
  EXPECT_EQ(lines[1].substr(overhead_end - 6, 6), "1.0123");
  // Readable units, no directory, no ".log".
  EXPECT_EQ(lines[1].substr(0, 9), "resnet32 ");
  EXPECT_EQ(lines[2].substr(0, 9), "unet     ");
  EXPECT_THAT(table, Not(HasSubstr(".log")));
  EXPECT_THAT(lines[1], HasSubstr("4.68 GiB"));
  EXPECT_THAT(lines[1], HasSubstr(" 3.6 "));  // replayed ms
  // Fragmentation: "-" in counter mode, a value in arena mode.
  const std::size_t frag_end = lines[0].find("frag") + 4;
  EXPECT_EQ(lines[1].substr(frag_end - 1, 1), "-");
  EXPECT_EQ(lines[2].substr(frag_end - 6, 6), "0.1250");
  EXPECT_THAT(lines[2], HasSubstr(" oom "));
  // Paging columns: the mode, bytes paged out and in in readable units, the stall in ms.
  const std::size_t offload_start = lines[0].find("offload");
  EXPECT_EQ(lines[1].substr(offload_start, 4), "off ");
  EXPECT_EQ(lines[2].substr(offload_start, 5), "auto ");
  const std::size_t out_end = lines[0].find("paged out") + std::string("paged out").size();
  EXPECT_EQ(lines[1].substr(out_end - 3, 3), "0 B");
  EXPECT_EQ(lines[2].substr(out_end - 8, 8), "3.00 MiB");
  const std::size_t in_end = lines[0].find("paged in") + std::string("paged in").size();
  EXPECT_EQ(lines[2].substr(in_end - 8, 8), "1.00 MiB");
  const std::size_t stall_end = lines[0].find("stall ms") + std::string("stall ms").size();
  EXPECT_EQ(lines[1].substr(stall_end - 3, 3), "0.0");
  EXPECT_EQ(lines[2].substr(stall_end - 3, 3), "0.3");
  // The oom run stopped early: its overhead is bracketed, still right-aligned under the header.
  EXPECT_EQ(lines[2].substr(overhead_end - 8, 8), "(1.0123)");
}

TEST(ResultTableTest, TraceLabelsGrowUntilTheyDiffer) {
  SimRow a = CounterRow();
  a.trace = "bert-16-2020-default.log";
  SimRow b = a;
  b.trace = "bert-32-2020-default.log";
  SimRow c = a;
  c.trace = "gpt.log";
  const std::string table = FormatTable({a, b, c, a});
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[1].substr(0, 8), "bert-16 ");
  EXPECT_EQ(lines[2].substr(0, 8), "bert-32 ");
  EXPECT_EQ(lines[3].substr(0, 8), "gpt     ");
  EXPECT_EQ(lines[4].substr(0, 8), "bert-16 ");
}

TEST(ResultTableTest, OneTraceGetsItsFirstPart) {
  SimRow a = CounterRow();
  a.trace = "x-1.log";
  const std::string table = FormatTable({a, a});
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].substr(0, 2), "x ");
  EXPECT_EQ(lines[2].substr(0, 2), "x ");
}

}  // namespace
}  // namespace remat::sim
