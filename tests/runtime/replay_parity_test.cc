// Parity with the DTR prototype's simulator (simrd): every row of ../shared/traces/dtr/simrd_reference.csv for
// dtr, dtr-eq, dtr-local, msps, lru and largest must give the same result (pass/oom/thrash) and an overhead within
// 1% of the reference, in counter mode with the DTR paper's engine configuration (EngineConfig::kDtrPaper). RandomStorage rows are not a parity target
// (one unseeded trial); `random` still runs on them and must not crash.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "runtime/replay.h"
#include "runtime/trace.h"

namespace remat {
namespace {

std::string SharedDir() {
  const char* env = std::getenv("REMAT_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("/work/main/../shared");
}

struct Row {
  std::string log, heuristic, result;
  double ratio = 0, overhead = 0;
  std::int64_t baseline_compute = 0, baseline_memory = 0, budget = 0, max_memory = 0, remat_compute = 0;
};

std::string PolicyFor(const std::string& heuristic) {
  static const std::map<std::string, std::string> names = {
      {"DTR", "dtr"}, {"DTREqClass", "dtr-eq"}, {"DTRLocal", "dtr-local"}, {"MSPS", "msps"},
      {"LRU", "lru"}, {"LargestStorage", "largest"}, {"RandomStorage", "random"}};
  auto it = names.find(heuristic);
  return it == names.end() ? std::string() : it->second;
}

TEST(ReplayParityTest, MatchesSimrdOnEveryReferenceRow) {
  const std::string dir = SharedDir() + "/traces/dtr/";
  std::ifstream csv(dir + "simrd_reference.csv");
  ASSERT_TRUE(csv.good()) << "cannot open " << dir
                          << "simrd_reference.csv: set REMAT_SHARED_DIR to the shared directory (the one holding "
                             "traces/dtr/); this test never skips";
  std::vector<Row> rows;
  std::string line;
  std::getline(csv, line);  // header
  while (std::getline(csv, line)) {
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_GE(f.size(), 10u) << line;
    Row r;
    r.log = f[0];
    r.heuristic = f[1];
    r.ratio = std::stod(f[2]);
    r.result = f[3];
    r.overhead = f[4].empty() ? 0 : std::stod(f[4]);
    r.baseline_compute = std::stoll(f[5]);
    r.baseline_memory = std::stoll(f[6]);
    r.budget = std::stoll(f[7]);
    r.max_memory = std::stoll(f[8]);
    r.remat_compute = std::stoll(f[9]);
    rows.push_back(r);
  }
  ASSERT_EQ(rows.size(), 221u);

  auto start = std::chrono::steady_clock::now();
  std::map<std::string, std::unique_ptr<Trace>> traces;
  std::map<std::string, std::unique_ptr<Replayer>> replayers;
  int matched = 0, checked = 0, random_ran = 0;
  double worst = 0;
  std::string worst_row;
  for (const Row& row : rows) {
    if (!replayers.count(row.log)) {
      absl::StatusOr<Trace> t = ReadTrace(dir + row.log);
      ASSERT_TRUE(t.ok()) << t.status();
      traces[row.log] = std::make_unique<Trace>(std::move(*t));
      absl::StatusOr<std::unique_ptr<Replayer>> rp = Replayer::Create(*traces[row.log]);
      ASSERT_TRUE(rp.ok()) << rp.status();
      replayers[row.log] = std::move(*rp);
      EXPECT_EQ(replayers[row.log]->baseline(EngineConfig::kDtrPaper).compute_ns, row.baseline_compute) << row.log;
      EXPECT_EQ(replayers[row.log]->baseline(EngineConfig::kDtrPaper).memory_bytes, row.baseline_memory) << row.log;
    }
    std::string policy = PolicyFor(row.heuristic);
    ASSERT_FALSE(policy.empty()) << row.heuristic;
    ReplayOptions options;
    options.policy = policy;
    options.budget_ratio = row.ratio;
    options.engine = EngineConfig::kDtrPaper;
    ReplayResult r = replayers[row.log]->Run(options);
    std::string label = row.log.substr(0, row.log.find('-')) + " " + row.heuristic + " " + std::to_string(row.ratio);
    if (std::getenv("REMAT_PARITY_VERBOSE") != nullptr) {
      std::printf("%-40s %-7s %8.1f ms  evictions %lld remats %lld\n", label.c_str(),
                  std::string(ToString(r.status)).c_str(), r.wall_time_ns / 1e6, static_cast<long long>(r.evictions),
                  static_cast<long long>(r.rematerializations));
    }
    if (policy == "random") {
      EXPECT_NE(r.status, ReplayStatus::kError) << label << ": " << r.message;
      ++random_ran;
      continue;
    }
    ++checked;
    EXPECT_EQ(r.budget_bytes, row.budget) << label;
    std::string expected = row.result == "pass" ? "pass" : row.result == "OOM" ? "oom" : "thrash";
    bool ok = std::string(ToString(r.status)) == expected;
    double diff = 0;
    if (ok && expected == "pass") {
      diff = std::abs(r.overhead - row.overhead) / row.overhead;
      ok = diff <= 0.01;
      if (diff > worst) {
        worst = diff;
        worst_row = label;
      }
    }
    if (ok) ++matched;
    EXPECT_TRUE(ok) << label << ": got " << ToString(r.status) << " overhead " << r.overhead << " remat "
                    << r.replayed_cost_ns << " peak " << r.peak_bytes << "; simrd " << row.result << " overhead "
                    << row.overhead << " remat " << row.remat_compute << " peak " << row.max_memory << " ("
                    << r.message << ")";
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("parity: %d/%d rows matched (random ran on %d rows); worst overhead difference %.4f%% (%s); "
              "wall %.2f s for all %zu rows including parsing\n",
              matched, checked, random_ran, worst * 100, worst_row.c_str(), seconds, rows.size());
}

}  // namespace
}  // namespace remat
