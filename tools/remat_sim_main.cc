// remat-sim: replays operator traces through the remat engine under memory budgets and eviction policies.
// Usage and flags: tools/sim_options.h (or `remat-sim --help`).
//
// Exit status: 0 every simulation ran (pass, oom and thrash are results), 2 command-line error (unknown flag,
// policy or mode, malformed list, missing trace file), 1 unreadable or malformed trace, or an output that could
// not be written.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "policies/registry.h"
#include "runtime/byte_size.h"
#include "runtime/replay.h"
#include "tools/plot_launcher.h"
#include "tools/timeline_writer.h"
#include "tools/progress_bar.h"
#include "tools/result_table.h"
#include "tools/sim_options.h"
#include "tools/sim_planner.h"
#include "tools/sim_runner.h"

namespace remat::sim {
namespace {

constexpr int kFailureExitCode = 1;

Vocabulary EngineVocabulary() {
  Vocabulary vocabulary;
  for (const auto& name : PolicyNames()) vocabulary.policies.emplace_back(name);
  vocabulary.modes = {std::string(ToString(AccountingMode::kCounter)), std::string(ToString(AccountingMode::kArena)),
                      "stitch"};
  vocabulary.default_policy = ReplayOptions().policy;
  vocabulary.default_mode = std::string(ToString(ReplayOptions().mode));
  vocabulary.planners = {"checkmate", "rotor"};
  return vocabulary;
}

int UsageError(const std::string& program, absl::string_view message) {
  std::cerr << program << ": " << message << "\n"
            << "usage: " << program << " TRACE... [--ratios R,...|--budgets SIZE,...] [--policies P,...] "
            << "[--mode counter|arena|stitch] [--granule SIZE] [--offload off|auto|always,...] [--bandwidth RATE] [--out FILE.csv|.json] "
            << "[--plot FILE.png] (--help for more)\n";
  return kUsageExitCode;
}

// "resnet32 dtr-eq 0.5 pass" for the progress line.
std::string ProgressLabel(const SimRow& row) {
  const std::string budget = row.budget_given
                                 ? FormatBytes(static_cast<std::uint64_t>(row.budget_bytes))
                                 : absl::StrFormat("%.2f", row.ratio);
  return absl::StrCat(row.trace.substr(0, row.trace.find('-')), " ", row.policy,
                      row.offload == "off" ? "" : absl::StrCat(" offload=", row.offload), " ", budget, " ",
                      row.result);
}

bool WriteRows(const std::vector<SimRow>& rows, const std::string& path, OutFormat format, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    *error = absl::StrCat("cannot open '", path, "' for writing");
    return false;
  }
  if (format == OutFormat::kJson) {
    WriteJson(rows, out);
  } else {
    WriteCsv(rows, out);
  }
  out.close();
  if (!out) {
    *error = absl::StrCat("failed writing '", path, "' (", std::strerror(errno), "); the results are incomplete");
    return false;
  }
  return true;
}

// Writes the run's timeline: `path` itself when it is .json, else the JSON next to the .png and the plot of it.
absl::Status DrawTimeline(const std::vector<TimelineSample>& timeline, const SimRow& row, const std::string& path) {
  const std::string title = absl::StrCat(std::filesystem::path(row.trace).filename().string(), ", ", row.policy,
                                         ", ", row.mode, " mode, budget ", row.budget_bytes, " bytes: ", row.result);
  const bool png = absl::EndsWith(path, ".png");
  const std::string json = png ? absl::StrCat(path.substr(0, path.size() - 4), ".json") : path;
  if (absl::Status written = WriteTimeline(timeline, title, json); !written.ok()) return written;
  if (!png) return absl::OkStatus();
  return RunPythonScript(FindPython(), {TimelineScriptPath(), json, path, "--title", title});
}

int Main(int argc, char** argv) {
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  const Vocabulary vocabulary = EngineVocabulary();
  absl::StatusOr<SimOptions> parsed = ParseSimOptions(std::vector<std::string>(argv + 1, argv + argc), vocabulary);
  if (!parsed.ok()) return UsageError(program, parsed.status().message());
  const SimOptions& options = *parsed;
  if (options.help) {
    std::cout << UsageText(program, vocabulary);
    return 0;
  }
  if (!options.planners.empty() && (options.dtr_paper || options.mode != "counter" || options.page_constants)) {
    return UsageError(program, "--planner plans for counter mode and the product's engine configuration, and never "
                               "pages constants: drop --mode arena/stitch, --dtr-paper and --page-constants");
  }
  for (const std::string& trace : options.traces) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(trace, error)) {
      return UsageError(program, absl::StrCat("trace file '", trace, "' not found (or not a regular file)"));
    }
  }

  absl::StatusOr<std::unique_ptr<SimRunner>> runner = SimRunner::Prepare(options);
  if (!runner.ok()) {
    std::cerr << program << ": " << runner.status().message() << "\n";
    return kFailureExitCode;
  }

  const std::vector<SimJob> jobs = PlanJobs(options);
  if (!options.timeline.empty() && jobs.size() != 1) {
    return UsageError(program, absl::StrCat("--timeline draws one run: give one trace, one policy, one offload mode "
                                            "and one ratio or budget (this command line plans ",
                                            jobs.size(), " runs)"));
  }
  std::vector<TimelineSample> timeline;
  ProgressBar progress = ProgressBar::ForStderr();
  std::vector<SimRow> rows = (*runner)->Run(
      jobs, options.jobs,
      [&](const SimRow& row, std::size_t done, std::size_t total) { progress.Update(done, total, ProgressLabel(row)); },
      options.timeline.empty() ? nullptr : &timeline);
  progress.Finish();

  std::cout << FormatTable(rows) << std::flush;
  if (!std::cout) {  // a full disk or a closed pipe: the table is lost, and the run must say so
    std::cerr << program << ": cannot write the table to standard output: " << std::strerror(errno) << "\n";
    return kFailureExitCode;
  }
  if (!options.planners.empty() && !RunPlanners(program, options, **runner, rows, std::cout, std::cerr)) {
    return kFailureExitCode;
  }
  int status = 0;
  for (const SimRow& row : rows) {
    if (row.result == "error") {
      std::cerr << program << ": " << row.trace << " " << row.policy << ": " << row.message << "\n";
      status = kFailureExitCode;
    }
  }

  std::string error;
  if (!options.out.empty() && !WriteRows(rows, options.out, options.out_format, &error)) {
    std::cerr << program << ": " << error << "\n";
    return kFailureExitCode;
  }
  if (!options.timeline.empty()) {
    if (absl::Status drawn = DrawTimeline(timeline, rows.front(), options.timeline); !drawn.ok()) {
      std::cerr << program << ": timeline: " << drawn.message() << "\n";
      return kFailureExitCode;
    }
  }
  if (!options.plot.empty()) {
    // The plot script reads CSV: reuse --out when it is CSV, else write a temporary CSV.
    std::string csv = options.out_format == OutFormat::kCsv ? options.out : "";
    std::string temporary;
    if (csv.empty()) {
      const char* tmpdir = std::getenv("TMPDIR");
      std::string pattern = absl::StrCat(tmpdir && *tmpdir ? tmpdir : "/tmp", "/remat-sim-XXXXXX.csv");
      const int fd = ::mkstemps(pattern.data(), 4);
      if (fd < 0) {
        std::cerr << program << ": cannot create a temporary CSV for the plot in " << pattern << "\n";
        return kFailureExitCode;
      }
      ::close(fd);
      temporary = csv = pattern;
      if (!WriteRows(rows, csv, OutFormat::kCsv, &error)) {
        std::cerr << program << ": " << error << "\n";
        std::error_code ignored;
        std::filesystem::remove(temporary, ignored);
        return kFailureExitCode;
      }
    }
    absl::Status plotted = RunPlot(FindPython(), PlotScriptPath(), csv, options.plot);
    if (!temporary.empty()) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
    }
    if (!plotted.ok()) {
      std::cerr << program << ": plot: " << plotted.message() << "\n";
      return kFailureExitCode;
    }
  }
  return status;
}

}  // namespace
}  // namespace remat::sim

int main(int argc, char** argv) { return remat::sim::Main(argc, argv); }
