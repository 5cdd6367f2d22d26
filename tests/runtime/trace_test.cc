#include "runtime/trace.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/replay.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

TEST(TraceTest, ParsesCallsConstantsAndViews) {
  const char* text =
      R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"a"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"a"}
{"ARGS":["a"],"INSTRUCTION":"CALL","NAME":"t","RESULT":["b","c"],"TIME":"7"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"b"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"b"}
{"INSTRUCTION":"MEMORY","MEMORY":"40","NAME":"c"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"c"}
{"ARGS":["c","a"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"5"}
{"DST":"d","INSTRUCTION":"COPY","SRC":"c"}
{"INSTRUCTION":"RELEASE","NAME":"zzz"}
)";
  absl::StatusOr<Trace> t = ParseTrace(text, "x.log");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->ops.size(), 5u);
  EXPECT_EQ(t->ops[0].kind, TraceOpKind::kConstant);
  EXPECT_EQ(t->ops[0].bytes, 100);
  EXPECT_EQ(t->ops[1].kind, TraceOpKind::kCall);
  ASSERT_EQ(t->ops[1].results.size(), 2u);
  EXPECT_EQ(t->ops[1].results[0].alias, 0);
  EXPECT_EQ(t->ops[1].results[1].bytes, 40);
  EXPECT_EQ(t->ops[1].results[1].alias, -1);
  EXPECT_EQ(t->ops[1].line, 4);
  EXPECT_EQ(t->ops[2].kind, TraceOpKind::kMutate);
  EXPECT_EQ(t->ops[2].mutated, std::vector<int>{0});
  EXPECT_EQ(t->ops[3].kind, TraceOpKind::kCopy);
  EXPECT_EQ(t->ops[4].kind, TraceOpKind::kRelease);
  EXPECT_EQ(t->call_count, 2);
  EXPECT_EQ(t->total_time_ns, 12);
}

TEST(TraceTest, ErrorsNameFileLineAndReason) {
  auto err = [](const char* text) { return std::string(ParseTrace(text, "bad.log").status().message()); };
  EXPECT_THAT(err("{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"a\"}\n{\"INSTRUCTION\":\"RELEASE\",\"NAME\":\"a\"}\n"),
              HasSubstr("bad.log:2: CONSTANT 'a' (line 1) without its MEMORY"));
  EXPECT_THAT(err("{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"a\"}\n"), HasSubstr("bad.log:1: CONSTANT"));
  EXPECT_THAT(err("\n{\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\",\"ARGS\":[\"q\"],\"RESULT\":[],\"TIME\":\"1\"}\n"),
              HasSubstr("bad.log:2: unknown name 'q' in ARGS"));
  EXPECT_THAT(err("{\"INSTRUCTION\":\"CALL\",\"NAME\":\n"), HasSubstr("bad.log:1: malformed JSON line"));
  EXPECT_THAT(err("{\"INSTRUCTION\":\"FOO\"}\n"), HasSubstr("unknown INSTRUCTION 'FOO'"));
  EXPECT_THAT(std::string(ReadTrace("/nonexistent/t.log").status().message()), HasSubstr("/nonexistent/t.log"));
}

// Sizes and times that would make a peak or a clock wrap are errors at the line that reads them (issue 22): three
// 2^62-byte constants used to give a baseline peak of 2^62, a TIME of 2^62 a "thrash" row.
TEST(TraceTest, ValuesAndSumsAbove2To53AreErrorsAtTheirLine) {
  auto err = [](const std::string& text) { return std::string(ParseTrace(text, "big.log").status().message()); };
  auto constant = [](const std::string& name, const std::string& bytes) {
    return "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"" + name + "\"}\n{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"" +
           bytes + "\",\"NAME\":\"" + name + "\"}\n";
  };
  const std::string two_to_62 = "4611686018427387904";
  EXPECT_THAT(err(constant("a", two_to_62)), HasSubstr("big.log:2: MEMORY 4611686018427387904 is above 2^53"));
  const std::string half = "4503599627370496";  // 2^52: two fit exactly, a third does not
  EXPECT_TRUE(ParseTrace(constant("a", half) + constant("b", half), "ok.log").ok());
  EXPECT_THAT(err(constant("a", half) + constant("b", half) + constant("c", "1")),
              HasSubstr("big.log:6: the trace's MEMORY values add up to more than 2^53"));
  const std::string call = "{\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\",\"ARGS\":[],\"RESULT\":[],\"TIME\":\"";
  EXPECT_THAT(err(call + two_to_62 + "\"}\n"), HasSubstr("big.log:1: TIME 4611686018427387904 is above 2^53"));
  EXPECT_THAT(err(call + half + "\"}\n" + call + half + "\"}\n" + call + "1\"}\n"),
              HasSubstr("big.log:3: the trace's TIME values add up to more than 2^53"));
  // Out of int64's range altogether, as an integer or as a float: not an integer (no undefined conversion).
  EXPECT_THAT(err(constant("a", "99999999999999999999")), HasSubstr("big.log:2: MEMORY is not an integer"));
  EXPECT_THAT(err(constant("a", "1e300")), HasSubstr("big.log:2: MEMORY is not an integer"));
}

TEST(TraceTest, ReadsTheSharedTraces) {
  const char* env = std::getenv("REMAT_SHARED_DIR");
  std::string dir = std::string(env != nullptr ? env : "/work/main/../shared") + "/traces/dtr/";
  absl::StatusOr<Trace> t = ReadTrace(dir + "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log");
  ASSERT_TRUE(t.ok()) << t.status() << " (is REMAT_SHARED_DIR set to the shared directory?)";
  EXPECT_EQ(t->call_count, 286);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// Mangled traces (lines dropped, duplicated, truncated, characters replaced, sizes and times made huge), seeded from
// every shared trace, either parse or fail with "<path>:<line>: <reason>"; what parses replays to a result (any
// status), never a crash. `make sanitize` runs it under ASan and UBSan.
TEST(TraceFuzzTest, MangledTracesNeverCrash) {
  const char* env = std::getenv("REMAT_SHARED_DIR");
  std::string dir = std::string(env != nullptr && *env ? env : "/work/main/../shared") + "/traces/dtr/";
  constexpr const char* kSeeds[] = {
      "unet-6-8000000000.0-2020-10-1-10-57-18-default.log",
      "lstm-128-11000000000.0-2020-10-1-16-38-52-default.log",
      "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log",
      "transformer-10-8000000000.0-2020-10-1-10-56-5-default.log",
      "tv_densenet121-84-10000000000.0-2020-10-1-13-41-18-default.log",
  };
  constexpr int kRoundsPerSeed = 16;
  std::mt19937_64 rng(42);
  int parsed = 0, rejected = 0;
  for (const char* seed : kSeeds) {
    std::ifstream in(dir + seed);
    ASSERT_TRUE(in.good()) << dir << seed << " is missing (set REMAT_SHARED_DIR to the shared directory)";
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    for (int round = 0; round < kRoundsPerSeed; ++round) {
      std::vector<std::string> m = lines;
      for (int k = 0; k < 3; ++k) {
        std::size_t i = rng() % m.size();
        switch (rng() % 5) {
          case 0: m.erase(m.begin() + static_cast<std::ptrdiff_t>(i)); break;
          case 1: m.insert(m.begin() + static_cast<std::ptrdiff_t>(i), m[rng() % m.size()]); break;
          case 2: m[i] = m[i].substr(0, rng() % (m[i].size() + 1)); break;
          case 3: {  // a size or a time near or past what remat accepts (2^53), or past int64
            static const char* kHuge[] = {"9007199254740992", "9007199254740993", "4611686018427387904",
                                          "9223372036854775807", "99999999999999999999", "1e300"};
            for (const char* key : {"\"MEMORY\":\"", "\"TIME\":\""}) {
              const std::size_t at = m[i].find(key);
              if (at == std::string::npos) continue;
              const std::size_t from = at + std::strlen(key);
              const std::size_t to = m[i].find('"', from);
              if (to != std::string::npos) m[i].replace(from, to - from, kHuge[rng() % 6]);
            }
            break;
          }
          default:
            if (!m[i].empty()) m[i][rng() % m[i].size()] = "x\"{}[],:0-"[rng() % 10];
        }
      }
      std::string text;
      for (const std::string& l : m) text += l + "\n";
      absl::StatusOr<Trace> t = ParseTrace(text, "mangled.log");
      if (!t.ok()) {
        ++rejected;
        EXPECT_THAT(std::string(t.status().message()), ::testing::StartsWith("mangled.log:"));
        continue;
      }
      ++parsed;
      ReplayOptions o;
      o.budget_ratio = 0.5;
      ReplayResult r = Replay(*t, o);
      (void)r;
    }
  }
  // Both outcomes happen: the mutations reach the checks and, past them, the replay.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace remat
