// Hand-written argv parsing: the flag set is small, and hand parsing gives messages that name the exact argument
// and the accepted forms (absl::flags would also accept forms we want to reject, such as single-dash flags).
#include "tools/sim_options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "runtime/byte_size.h"
#include "runtime/config.h"

namespace remat::sim {
namespace {

absl::Status Bad(absl::string_view flag, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", message));
}

// Splits a comma-separated list; rejects an empty list, empty elements and duplicates.
absl::StatusOr<std::vector<std::string>> SplitList(absl::string_view flag, absl::string_view value) {
  if (value.empty()) return Bad(flag, "expects a comma-separated list, got an empty value");
  std::vector<std::string> items = absl::StrSplit(value, ',');
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].empty()) {
      return Bad(flag, absl::StrCat("empty element in '", value, "' (position ", i + 1, ")"));
    }
    if (std::find(items.begin(), items.begin() + i, items[i]) != items.begin() + i) {
      return Bad(flag, absl::StrCat("'", items[i], "' is listed twice"));
    }
  }
  return items;
}

absl::StatusOr<double> ParseRatio(absl::string_view text) {
  double value = 0;
  // SimpleAtod accepts "nan", "inf" and hex floats; the checks below reject the non-finite ones, and the
  // character check keeps the accepted form to plain decimals.
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+';
  });
  if (!plain || !absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return Bad("--ratios", absl::StrCat("'", text, "' is not a number (expected a decimal such as 0.5)"));
  }
  if (value <= 0 || value > 1) {
    return Bad("--ratios", absl::StrCat("'", text, "' is out of range: a ratio must be in (0, 1]"));
  }
  return value;
}

absl::StatusOr<double> ParseFiniteDouble(absl::string_view flag, absl::string_view text) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return Bad(flag, absl::StrCat("'", text, "' is not a finite number"));
  }
  return value;
}

std::string Quoted(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ");
}

bool Contains(const std::vector<std::string>& names, absl::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool PlainDecimal(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+';
  });
}

constexpr char kBandwidthForms[] =
    "a byte size per second, optionally followed by /s: e.g. 12GB/s, 12e9, 1.5GiB/s, 900MB (units as for "
    "--budgets: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, K, M, G, T)";
constexpr char kDurationForms[] = "a non-negative decimal with a unit ns, us, ms or s, e.g. 10us, 0.5ms, 250ns, "
                                  "or 0";

}  // namespace

absl::StatusOr<double> ParseBandwidth(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  absl::string_view rate = absl::StripAsciiWhitespace(text);
  if (absl::EndsWith(rate, "/s")) rate = absl::StripAsciiWhitespace(rate.substr(0, rate.size() - 2));
  double value = 0;
  if (PlainDecimal(rate)) {
    // A bare number, scientific notation allowed ("12e9"), which ParseByteSize does not take.
    if (!absl::SimpleAtod(rate, &value) || !std::isfinite(value)) {
      return Bad("--bandwidth", absl::StrCat("'", text, "' is not a rate; expected ", kBandwidthForms));
    }
  } else {
    absl::StatusOr<std::uint64_t> bytes = ParseByteSize(std::string_view(rate.data(), rate.size()));
    if (!bytes.ok()) {
      return Bad("--bandwidth", absl::StrCat("'", text, "' is not a rate; expected ", kBandwidthForms));
    }
    value = static_cast<double>(*bytes);
  }
  if (!(value > 0)) return Bad("--bandwidth", absl::StrCat("'", text, "' must be greater than zero"));
  return value;
}

absl::StatusOr<std::int64_t> ParseDuration(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  std::size_t end = 0;
  while (end < trimmed.size() && ((trimmed[end] >= '0' && trimmed[end] <= '9') || trimmed[end] == '.')) ++end;
  const absl::string_view number = trimmed.substr(0, end);
  const absl::string_view unit = absl::StripAsciiWhitespace(trimmed.substr(end));
  double value = 0;
  const bool digits = std::any_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return Bad("--link-latency", absl::StrCat("'", text, "' is not a duration; expected ", kDurationForms));
  }
  double scale = 0;
  if (unit == "ns") {
    scale = 1;
  } else if (unit == "us") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else if (unit.empty() && value == 0) {
    scale = 1;
  } else {
    return Bad("--link-latency", absl::StrCat("'", text, "' has ", unit.empty() ? "no unit" : "an unknown unit",
                                              "; expected ", kDurationForms));
  }
  const double ns = value * scale;
  if (ns > 1e15) return Bad("--link-latency", absl::StrCat("'", text, "' is too large"));
  if (ns != std::floor(ns)) {
    return Bad("--link-latency", absl::StrCat("'", text, "' is not a whole number of nanoseconds"));
  }
  return static_cast<std::int64_t>(ns);
}

std::vector<double> DefaultRatios() {
  std::vector<double> ratios;
  for (int tenth = 9; tenth >= 1; --tenth) ratios.push_back(tenth / 10.0);
  return ratios;
}

absl::StatusOr<SimOptions> ParseSimOptions(const std::vector<std::string>& args, const Vocabulary& vocabulary) {
  SimOptions options;
  options.mode = vocabulary.default_mode;
  bool have_ratios = false;
  bool have_budgets = false;
  bool have_policies = false;

  // Flags that take a value, and what to do with it.
  using Handler = std::function<absl::Status(absl::string_view)>;
  const std::map<std::string, Handler, std::less<>> valued = {
      {"--ratios",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<std::vector<std::string>> items = SplitList("--ratios", value);
         if (!items.ok()) return items.status();
         options.ratios.clear();
         for (const std::string& item : *items) {
           absl::StatusOr<double> ratio = ParseRatio(item);
           if (!ratio.ok()) return ratio.status();
           if (std::find(options.ratios.begin(), options.ratios.end(), *ratio) != options.ratios.end()) {
             return Bad("--ratios", absl::StrCat("'", item, "' repeats a ratio already listed"));
           }
           options.ratios.push_back(*ratio);
         }
         have_ratios = true;
         return absl::OkStatus();
       }},
      {"--budgets",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<std::vector<std::string>> items = SplitList("--budgets", value);
         if (!items.ok()) return items.status();
         options.budgets.clear();
         for (const std::string& item : *items) {
           absl::StatusOr<std::uint64_t> bytes = ParseByteSize(item);
           if (!bytes.ok()) return Bad("--budgets", bytes.status().message());
           if (*bytes == 0) return Bad("--budgets", absl::StrCat("'", item, "' is zero bytes"));
           if (std::find(options.budgets.begin(), options.budgets.end(), *bytes) != options.budgets.end()) {
             return Bad("--budgets", absl::StrCat("'", item, "' repeats a budget already listed"));
           }
           options.budgets.push_back(*bytes);
         }
         have_budgets = true;
         return absl::OkStatus();
       }},
      {"--policies",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<std::vector<std::string>> items = SplitList("--policies", value);
         if (!items.ok()) return items.status();
         for (const std::string& item : *items) {
           if (!Contains(vocabulary.policies, item)) {
             return Bad("--policies",
                        absl::StrCat("unknown policy '", item, "' (known: ", Quoted(vocabulary.policies), ")"));
           }
         }
         options.policies = *std::move(items);
         have_policies = true;
         return absl::OkStatus();
       }},
      {"--mode",
       [&](absl::string_view value) -> absl::Status {
         if (!Contains(vocabulary.modes, value)) {
           return Bad("--mode", absl::StrCat("unknown mode '", value, "' (known: ", Quoted(vocabulary.modes), ")"));
         }
         options.mode = std::string(value);
         return absl::OkStatus();
       }},
      {"--overhead-limit",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<double> limit = ParseFiniteDouble("--overhead-limit", value);
         if (!limit.ok()) return limit.status();
         options.overhead_limit = *limit;
         return absl::OkStatus();
       }},
      {"--out",
       [&](absl::string_view value) -> absl::Status {
         if (absl::EndsWith(value, ".csv") && value.size() > 4) {
           options.out_format = OutFormat::kCsv;
         } else if (absl::EndsWith(value, ".json") && value.size() > 5) {
           options.out_format = OutFormat::kJson;
         } else {
           return Bad("--out", absl::StrCat("'", value, "' must end in .csv or .json"));
         }
         options.out = std::string(value);
         return absl::OkStatus();
       }},
      {"--plot",
       [&](absl::string_view value) -> absl::Status {
         if (!absl::EndsWith(value, ".png") || value.size() <= 4) {
           return Bad("--plot", absl::StrCat("'", value, "' must end in .png"));
         }
         options.plot = std::string(value);
         return absl::OkStatus();
       }},
      {"--timeline",
       [&](absl::string_view value) -> absl::Status {
         if (!(absl::EndsWith(value, ".png") && value.size() > 4) &&
             !(absl::EndsWith(value, ".json") && value.size() > 5)) {
           return Bad("--timeline", absl::StrCat("'", value, "' must end in .png or .json"));
         }
         options.timeline = std::string(value);
         return absl::OkStatus();
       }},
      {"--jobs",
       [&](absl::string_view value) -> absl::Status {
         int jobs = 0;
         if (!absl::SimpleAtoi(value, &jobs) || jobs < 0 || jobs > 1024) {
           return Bad("--jobs", absl::StrCat("'", value, "' is not an integer in [0, 1024] (0: one per core)"));
         }
         options.jobs = jobs;
         return absl::OkStatus();
       }},
      {"--offload",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<std::vector<std::string>> items = SplitList("--offload", value);
         if (!items.ok()) return items.status();
         for (const std::string& item : *items) {
           if (!ParseOffloadMode(item).ok()) {
             return Bad("--offload", absl::StrCat("unknown offload mode '", item,
                                                  "' (known: off, auto, always; a comma list compares modes)"));
           }
         }
         options.offload = *std::move(items);
         return absl::OkStatus();
       }},
      {"--bandwidth",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<double> rate = ParseBandwidth(std::string_view(value.data(), value.size()));
         if (!rate.ok()) return rate.status();
         options.bandwidth_bytes_per_s = *rate;
         return absl::OkStatus();
       }},
      {"--link-latency",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<std::int64_t> ns = ParseDuration(std::string_view(value.data(), value.size()));
         if (!ns.ok()) return ns.status();
         options.link_latency_ns = *ns;
         return absl::OkStatus();
       }},
      {"--host-budget",
       [&](absl::string_view value) -> absl::Status {
         absl::StatusOr<std::uint64_t> bytes = ParseByteSize(std::string_view(value.data(), value.size()));
         if (!bytes.ok()) return Bad("--host-budget", bytes.status().message());
         if (*bytes == 0) {
           return Bad("--host-budget", absl::StrCat("'", value, "' is zero bytes (omit the flag for unlimited)"));
         }
         options.host_budget_bytes = *bytes;
         return absl::OkStatus();
       }},
      {"--seed",
       [&](absl::string_view value) -> absl::Status {
         if (!absl::SimpleAtoi(value, &options.seed) || absl::StartsWith(value, "-")) {
           return Bad("--seed", absl::StrCat("'", value, "' is not a non-negative integer"));
         }
         return absl::OkStatus();
       }},
  };
  const std::map<std::string, bool*, std::less<>> switches = {
      {"--help", &options.help},
      {"--sample-sqrt", &options.sample_sqrt},
      {"--ignore-small", &options.ignore_small},
      {"--page-constants", &options.page_constants},
      {"--duplex-link", &options.duplex_link},
      {"--dtr-paper", &options.dtr_paper},
  };
  const std::map<std::string, bool*, std::less<>> negations = {
      {"--no-partition", &options.cheap_tensor_partitioning},
  };

  bool flags_ended = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_ended || !absl::StartsWith(arg, "-") || arg == "-") {
      options.traces.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    if (arg == "-h") {
      options.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option '", arg, "' (options are spelled with two dashes, e.g. --ratios)"));
    }
    const std::size_t eq = arg.find('=');
    const absl::string_view name = absl::string_view(arg).substr(0, eq);
    if (auto it = valued.find(name); it != valued.end()) {
      absl::string_view value;
      if (eq != std::string::npos) {
        value = absl::string_view(arg).substr(eq + 1);
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return Bad(name, "missing value");
      }
      if (absl::Status status = it->second(value); !status.ok()) return status;
      continue;
    }
    auto on = switches.find(name);
    auto off = negations.find(name);
    if (on != switches.end() || off != negations.end()) {
      if (eq != std::string::npos) return Bad(name, "takes no value");
      if (on != switches.end()) *on->second = true;
      if (off != negations.end()) *off->second = false;
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown option '", name, "' (see --help)"));
  }

  if (options.help) return options;
  if (have_ratios && have_budgets) {
    return absl::InvalidArgumentError("--ratios and --budgets exclude each other; give one of them");
  }
  if (options.traces.empty()) return absl::InvalidArgumentError("no trace file given");
  for (std::size_t i = 0; i < options.traces.size(); ++i) {
    if (std::find(options.traces.begin(), options.traces.begin() + i, options.traces[i]) !=
        options.traces.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("trace '", options.traces[i], "' is given twice"));
    }
  }
  if (!have_ratios && !have_budgets) options.ratios = DefaultRatios();
  if (!have_policies) options.policies = {vocabulary.default_policy};
  return options;
}

std::string UsageText(std::string_view program_name, const Vocabulary& vocabulary) {
  const absl::string_view program(program_name.data(), program_name.size());
  return absl::StrCat(
      "usage: ", program, " TRACE... [options]\n",
      "\n"
      "Replays operator traces (the DTR prototype's JSON-lines format) through the remat engine under memory\n"
      "budgets and eviction policies, and reports one row per (trace, policy, ratio or budget).\n"
      "\n"
      "options:\n"
      "  --ratios R,...          budgets as fractions of the unconstrained peak (constants included), each in\n"
      "                          (0, 1]; default 0.9,0.8,...,0.1\n"
      "  --budgets SIZE,...      absolute budgets with units, e.g. 4GiB,512MiB,1000000 (excludes --ratios)\n"
      "  --policies P,...        eviction policies (default ", vocabulary.default_policy, ")\n",
      "                          known: ", Quoted(vocabulary.policies), "\n",
      "  --mode M                byte accounting: ", Quoted(vocabulary.modes), " (default ",
      vocabulary.default_mode, ")\n",
      "  --overhead-limit X      a run whose compute exceeds X times the baseline is 'thrash' (default 2.0;\n"
      "                          <= 0 disables the check)\n"
      "  --out FILE              write the rows as CSV (FILE.csv) or JSON (FILE.json)\n"
      "  --plot FILE.png         plot overhead against memory ratio, one panel per trace, one line per policy\n"
      "                          (runs tools/plot_overhead.py with $REMAT_PYTHON, else $REMAT_VENV/bin/python,\n"
      "                          else ~/.cache/remat/venv/bin/python, else python3; needs matplotlib)\n"
      "  --timeline FILE.png|FILE.json  one run's memory over time: in use, paged out, evicted, released and\n"
      "                          rematerialized bytes, replays marked (JSON as remat.trace writes; .png also\n"
      "                          writes FILE.json and plots it with integration/python/remat/plot.py)\n"
      "  --jobs N                parallel simulations (default: one per core)\n"
      "  --seed N                seed for the random policy and for sampling (default 0)\n"
      "  --sample-sqrt           score only sqrt(n) random candidates per eviction (DTR prototype option)\n"
      "  --ignore-small          skip candidates smaller than 1% of the mean candidate size\n"
      "  --dtr-paper             the DTR paper's engine (its simulator, simrd, exactly: released storages stay\n"
      "                          in the graph, evicted views replay their view op, writes copy, no deferral)\n"
      "                          instead of what remat runs under PyTorch (runtime/replay.h); parity needs it\n"
      "  --no-partition          arena mode: no cheap-tensor partitioning (all blocks placed low)\n"
      "  --offload M,...         paging to a second (host) tier: off, auto (page or drop, whichever the cost\n"
      "                          model prefers), always (page whenever the host tier has room); a comma list\n"
      "                          runs every mode and gives one row per mode (e.g. off,auto); default off\n"
      "  --bandwidth RATE        link bandwidth, a byte size optionally followed by /s: 12GB/s, 12e9, 16GiB/s\n"
      "                          (default 12GB/s, V100 <-> pinned host memory as measured by Beaumont et al.)\n"
      "  --link-latency TIME     fixed cost per copy: 10us, 0.5ms, 250ns, 0 (default 10us)\n"
      "  --host-budget SIZE      second-tier capacity with units, e.g. 64GiB (default unlimited)\n"
      "  --page-constants        constants (weights) may be paged out too\n"
      "  --duplex-link           page-ins do not queue behind page-outs (one link per direction)\n"
      "  --help                  this text\n"
      "\n"
      "With offload on, overhead includes the time ops waited for page-ins (transfer stall); the table, CSV and\n"
      "JSON give the offload mode, bytes paged out and in, and the stall.\n"
      "A table goes to stdout; a progress bar goes to stderr when it is a terminal.\n"
      "Exit status: 0 when every simulation ran (whatever its result: pass, oom or thrash), 2 for a command-line\n"
      "error, 1 for an unreadable or malformed trace or a failed output.\n");
}

}  // namespace remat::sim
