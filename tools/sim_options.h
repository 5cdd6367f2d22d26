// SimOptions: the command line of `remat-sim`, parsed strictly (with CLI11; tools/sim_options.cc).
//
//   remat-sim TRACE... [--ratios R,... | --budgets SIZE,...] [--policies P,...] [--mode counter|arena]
//             [--overhead-limit X] [--out FILE.csv|FILE.json] [--plot FILE.png] [--timeline FILE.png|FILE.json]
//             [--jobs N] [--seed N]
//             [--sample-sqrt] [--ignore-small] [--dtr-paper] [--no-partition] [--foresight]
//             [--offload off|auto|always[,...]] [--bandwidth RATE] [--link-latency TIME] [--host-budget SIZE]
//             [--page-constants] [--duplex-link] [--planner NAME,...] [--planner-time-limit SECONDS]
//             [--planner-max-binaries N] [--segment FIRST+COUNT] [--help]
//
// Contract:
//   - Every flag takes its value either as the next argument or after '=' (`--ratios 0.5` or `--ratios=0.5`).
//     Anything starting with "--" that is not a flag below is an error; everything else is a trace path.
//     A lone "--" ends the flags: the arguments after it are trace paths even if they start with '-'.
//   - Lists are comma-separated, with no empty elements and no duplicates. A ratio is a finite decimal in
//     (0, 1] (relative to the unconstrained peak, constants included); a budget is a byte size with an optional
//     unit as accepted by runtime/byte_size.h (e.g. `4GiB`, `512MB`, `1000000`) and must be > 0.
//   - --ratios and --budgets exclude each other. With neither, the ratios are 0.9, 0.8, ..., 0.1.
//   - Policy and mode names are checked against the vocabulary the caller passes in (the engine's registry), so
//     this parser never goes stale; the default policy is the vocabulary's `default_policy`.
//   - --out must end in .csv or .json, --plot in .png. --jobs is a positive integer (0 or absent: one per core).
//   - --timeline draws one run: it must end in .json (the timeline as Chrome trace JSON) or .png (that JSON next
//     to it, FILE.json, and the plot of it), and the command line must plan exactly one run (one trace, one
//     policy, one offload mode, one ratio or budget).
//   - --overhead-limit is a finite number; <= 0 disables the thrash check.
//   - --offload is a comma list of offload modes (off, auto, always; runtime/config.h ParseOffloadMode), no
//     duplicates; each mode is a separate run, so a list compares modes in one invocation (one row per mode).
//     Default: off. --bandwidth is a byte size as for --budgets, optionally followed by "/s" ("12GB/s", "12e9",
//     "1.5GiB/s"), > 0; default 12 GB/s (12e9, ReplayOptions). --link-latency is a duration: a non-negative
//     decimal with a unit ns, us, ms or s ("10us", "0.5ms"; "0" alone is allowed); default ReplayOptions'
//     (10 us). --host-budget is a byte size > 0 (default: unlimited). --page-constants and --duplex-link are
//     switches. The paging flags are accepted with --offload off (they then change nothing).
//   - --planner is a comma list of offline planners from the vocabulary (`checkmate`, `rotor`), no duplicates:
//     after the policies' rows, remat-sim plans each (trace, ratio or budget, paging or not) offline and prints
//     the optimum next to the policies (tools/sim_planner.h). --planner-time-limit is the solver's limit in seconds per solve (a positive number,
//     optionally with "s" or "min": 300, 90s, 5min; default 300); --planner-max-binaries a positive integer
//     (default 400000). --segment FIRST+COUNT replaces every trace by its window of COUNT ops starting at op FIRST
//     (0-based, CALL and MUTATE counted; tools/trace_segment.h), for the policies and the planner alike.
//   - --foresight: the DTR family (dtr, dtr-eq, dtr-local) ranks by each candidate's distance to its next read in
//     the trace instead of the time since its last access (runtime/trace_future.h; ReplayOptions::foresight).
//   - At least one trace is required unless --help is given, and no trace path may be given twice. Existence of
//     the trace files is not checked here (see the tool's main), so parsing stays a pure function.
//   - Every error is InvalidArgument whose message names the offending argument and what is accepted; the tool
//     prints it with the usage line and exits with status 2.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace remat::sim {

// Names the engine accepts; supplied by the caller (policies/registry.h, runtime/replay.h).
struct Vocabulary {
  std::vector<std::string> policies;
  std::vector<std::string> modes;
  std::string default_policy;
  std::string default_mode;
  std::vector<std::string> planners;  // offline planners (--planner)
};

enum class OutFormat { kNone, kCsv, kJson };

struct SimOptions {
  bool help = false;
  std::vector<std::string> traces;
  std::vector<double> ratios;           // empty when budgets are given
  std::vector<std::uint64_t> budgets;   // bytes; empty when ratios are given
  std::vector<std::string> policies;
  std::string mode;
  double overhead_limit = 2.0;
  std::string out;                      // empty: no file
  OutFormat out_format = OutFormat::kNone;
  std::string plot;                     // empty: no plot
  std::string timeline;                 // empty: none; else FILE.json or FILE.png (one run's memory over time)
  int jobs = 0;                         // 0: one per core
  std::uint64_t seed = 0;
  bool sample_sqrt = false;
  bool ignore_small = false;
  bool dtr_paper = false;              // the DTR paper's engine configuration instead of the product's
  bool cheap_tensor_partitioning = true;
  std::size_t compact_first_limit = 2;  // --compact-first (ReplayOptions::compact_first_limit; 2 is its default)
  std::uint64_t granule_bytes = std::uint64_t{2} << 20;  // --mode stitch: the granule (CUDA's VMM granularity)
  // Paging (runtime/replay.h ReplayOptions). Names as given (validated against ParseOffloadMode).
  std::vector<std::string> offload = {"off"};
  double bandwidth_bytes_per_s = 12e9;
  std::int64_t link_latency_ns = -1;    // -1: the engine's default (ReplayOptions::link_latency_ns)
  std::uint64_t host_budget_bytes = 0;  // 0: unlimited
  bool page_constants = false;
  bool duplex_link = false;
  bool foresight = false;
  // Offline references (tools/checkmate_planner.h).
  std::vector<std::string> planners;    // empty: none
  double planner_time_limit_s = 300;
  std::int64_t planner_max_binaries = 400'000;
  std::int64_t segment_first = -1;      // -1: whole traces
  std::int64_t segment_count = 0;
};

// "12GB/s", "12e9", "1.5 GiB/s" -> bytes per second (> 0); InvalidArgument naming --bandwidth otherwise.
absl::StatusOr<double> ParseBandwidth(std::string_view text);
// "10us", "0.5ms", "250ns", "1s", "0" -> nanoseconds (whole, >= 0); InvalidArgument naming --link-latency otherwise.
absl::StatusOr<std::int64_t> ParseDuration(std::string_view text);

// The ratios used when neither --ratios nor --budgets is given: 0.9 down to 0.1 in steps of 0.1.
std::vector<double> DefaultRatios();

// `args` excludes the program name.
absl::StatusOr<SimOptions> ParseSimOptions(const std::vector<std::string>& args, const Vocabulary& vocabulary);

// The --help text (usage, every flag, the accepted policy and mode names).
std::string UsageText(std::string_view program, const Vocabulary& vocabulary);

// Exit status for a command-line error.
inline constexpr int kUsageExitCode = 2;

}  // namespace remat::sim
