// Paging table (issue 7): replays every trace of a directory (the DTR prototype's logs) in arena mode with `coop`
// and `dtr-eq` at budgets 0.9 .. 0.1 of the unconstrained peak, through Replayer (the same engine the product
// runs), with offload off, auto (the defaults: one FIFO link, prefetch into free memory), auto whose prefetch may
// make room, and auto over a duplex link; prints markdown: overhead per ratio and the lowest feasible ratio, then
// the paging counters of plain auto at 0.7/0.5/0.3. Link: 12 GB/s, 10 us per copy, unlimited host budget, prefetch
// lookahead 8 ops; thrash limit 2x (stall included) and the product engine configuration, as remat-sim's defaults. Progress: stderr.
//
//   paging_table [traces dir] [bandwidth bytes/s]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/replay.h"
#include "runtime/trace.h"

namespace remat {
namespace {

struct Cell {
  ReplayResult result;
};

std::string ShortName(const std::string& file) {
  std::string stem = std::filesystem::path(file).filename().string();
  return stem.substr(0, stem.find('-'));
}

std::string OverheadCell(const ReplayResult& r) {
  if (r.status == ReplayStatus::kPass) return absl::StrFormat("%.3f", r.overhead);
  return std::string(ToString(r.status));
}

int Main(int argc, char** argv) {
  const char* env = std::getenv("REMAT_SHARED_DIR");
  std::string dir = argc > 1 ? argv[1]
                             : std::string(env != nullptr && *env ? env : "/work/main/../shared") + "/traces/dtr";
  const double bandwidth = argc > 2 ? std::atof(argv[2]) : 12e9;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".log") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no .log traces in %s\n", dir.c_str());
    return 1;
  }
  const std::vector<double> ratios = {0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
  const std::vector<std::string> policies = {"coop", "dtr-eq"};
  // Rows: offload off; auto with prefetch into free memory only (the default); auto whose prefetch may make room.
  // Last row: the two directions of the link independent (page-ins do not queue behind page-outs).
  struct Mode {
    std::string label;
    OffloadMode offload;
    bool prefetch_evicts;
    bool duplex;
  };
  const std::vector<Mode> modes = {{"off", OffloadMode::kOff, false, false},
                                   {"auto", OffloadMode::kAuto, false, false},
                                   {"auto, prefetch evicts", OffloadMode::kAuto, true, false},
                                   {"auto, duplex link", OffloadMode::kAuto, false, true}};
  // results[trace][policy][mode index][ratio index]
  std::map<std::string, std::map<std::string, std::map<std::size_t, std::vector<ReplayResult>>>> results;
  for (const std::string& file : files) {
    absl::StatusOr<Trace> trace = ReadTrace(file);
    if (!trace.ok()) {
      std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
      return 1;
    }
    absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(*trace);
    if (!replayer.ok()) {
      std::fprintf(stderr, "%s\n", std::string(replayer.status().message()).c_str());
      return 1;
    }
    const std::string name = ShortName(file);
    for (const std::string& policy : policies) {
      for (std::size_t mi = 0; mi < modes.size(); ++mi) {
        const Mode& mode = modes[mi];
        for (double ratio : ratios) {
          ReplayOptions o;
          o.policy = policy;
          o.mode = AccountingMode::kArena;
          o.budget_ratio = ratio;
          o.offload = mode.offload;
          o.prefetch_evicts = mode.prefetch_evicts;
          o.duplex_link = mode.duplex;
          o.bandwidth_bytes_per_s = bandwidth;
          ReplayResult r = (*replayer)->Run(o);
          std::fprintf(stderr, "%s %s %s %.1f: %s %.3f (%.2f s)\n", name.c_str(), policy.c_str(),
                       mode.label.c_str(), ratio, std::string(ToString(r.status)).c_str(),
                       r.overhead, static_cast<double>(r.wall_time_ns) / 1e9);
          results[name][policy][mi].push_back(r);
        }
      }
    }
  }

  std::printf("Arena mode, link %.0f GB/s, 10 us per copy, host budget unlimited, prefetch lookahead 8 ops, "
              "thrash limit 2x, the product engine configuration. Overhead = (op time incl. replays + transfer stall) / baseline "
              "compute; oom/thrash = not feasible.\n\n",
              bandwidth / 1e9);
  std::printf("| trace | policy | offload |");
  for (double r : ratios) std::printf(" %.1f |", r);
  std::printf(" lowest feasible |\n|---|---|---|");
  for (std::size_t i = 0; i < ratios.size(); ++i) std::printf("---|");
  std::printf("---|\n");
  for (const auto& [trace, by_policy] : results) {
    for (const auto& [policy, by_mode] : by_policy) {
      for (const auto& [mode, row] : by_mode) {
        std::printf("| %s | %s | %s |", trace.c_str(), policy.c_str(), modes[mode].label.c_str());
        double lowest = 0;
        for (std::size_t i = 0; i < row.size(); ++i) {
          std::printf(" %s |", OverheadCell(row[i]).c_str());
          if (row[i].status == ReplayStatus::kPass) lowest = ratios[i];
        }
        std::printf(" %s |\n", lowest > 0 ? absl::StrFormat("%.1f", lowest).c_str() : "none");
      }
    }
  }

  std::printf("\nPaging counters (offload auto) next to offload off: replayed op time, bytes paged out / in, "
              "transfer stall, page-ins issued by prefetch, host peak.\n\n");
  std::printf("| trace | policy | ratio | overhead off | overhead auto | replayed ms off | replayed ms auto | "
              "paged out MB | paged in MB | stall ms | prefetched | host peak MB |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [trace, by_policy] : results) {
    for (const auto& [policy, by_mode] : by_policy) {
      const std::vector<ReplayResult>& off = by_mode.at(0);
      const std::vector<ReplayResult>& on = by_mode.at(1);
      for (std::size_t i = 0; i < ratios.size(); ++i) {
        if (ratios[i] != 0.7 && ratios[i] != 0.5 && ratios[i] != 0.3) continue;
        const ReplayResult& a = on[i];
        std::printf("| %s | %s | %.1f | %s | %s | %.1f | %.1f | %.0f | %.0f | %.2f | %lld | %.0f |\n", trace.c_str(),
                    policy.c_str(), ratios[i], OverheadCell(off[i]).c_str(), OverheadCell(a).c_str(),
                    off[i].replayed_cost_ns / 1e6, a.replayed_cost_ns / 1e6, a.paged_out_bytes / 1e6,
                    a.paged_in_bytes / 1e6, a.transfer_stall_ns / 1e6, static_cast<long long>(a.prefetches),
                    a.host_peak_bytes / 1e6);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace remat

int main(int argc, char** argv) { return remat::Main(argc, argv); }
