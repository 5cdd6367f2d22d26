// remat-sim's command line, read by CLI11 (Debian libcli11-dev): CLI11 splits the arguments into flags, values
// (`--flag value`, `--flag=value`), switches and trace paths (`--` ends the flags) and writes --help from the table
// in DefineFlags. The value parsers here check units, ranges, lists and names, and word every error as
// tools/sim_options.h promises.
#include "tools/sim_options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

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

bool PlainDecimal(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+';
  });
}

absl::StatusOr<double> ParseRatio(absl::string_view text) {
  double value = 0;
  // SimpleAtod accepts "nan", "inf" and hex floats: plain decimals only, and finite.
  if (!PlainDecimal(text) || !absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
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

template <typename T, typename U>
bool Contains(const std::vector<T>& values, const U& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// A byte size (runtime/byte_size.h) above zero.
absl::StatusOr<std::uint64_t> ParseSize(absl::string_view flag, const std::string& text, const char* zero_hint = "") {
  absl::StatusOr<std::uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) return Bad(flag, bytes.status().message());
  if (*bytes == 0) return Bad(flag, absl::StrCat("'", text, "' is zero bytes", zero_hint));
  return bytes;
}

// `name` if it is in `known`.
absl::StatusOr<std::string> Known(absl::string_view flag, const char* what, const std::vector<std::string>& known,
                                  const std::string& name) {
  if (Contains(known, name)) return name;
  return Bad(flag, absl::StrCat("unknown ", what, " '", name, "' (known: ", Quoted(known), ")"));
}

// A comma list (SplitList), each element parsed by `parse` into `out`; a `what` listed twice in other words
// ("0.5,0.50") is an error too.
template <typename T, typename Parse>
absl::Status ParseList(absl::string_view flag, const char* what, const std::string& text, Parse parse,
                       std::vector<T>& out) {
  absl::StatusOr<std::vector<std::string>> items = SplitList(flag, text);
  if (!items.ok()) return items.status();
  out.clear();
  for (const std::string& item : *items) {
    absl::StatusOr<T> value = parse(item);
    if (!value.ok()) return value.status();
    if (Contains(out, *value)) return Bad(flag, absl::StrCat("'", item, "' repeats a ", what, " already listed"));
    out.push_back(*std::move(value));
  }
  return absl::OkStatus();
}

// Stores a parsed value.
template <typename T>
absl::Status Set(absl::StatusOr<T> value, T& field) {
  if (value.ok()) field = *std::move(value);
  return value.status();
}

// A file name: a stem, then `suffix`.
bool EndsIn(absl::string_view name, absl::string_view suffix) {
  return name.size() > suffix.size() && absl::EndsWith(name, suffix);
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

namespace {

// --help: the usage line first, then the description.
class HelpFormat : public CLI::Formatter {
 public:
  std::string make_description(const CLI::App* app) const override {
    return absl::StrCat("usage: ", app->get_name(), " TRACE... [options]\n\n", app->get_description(), "\n");
  }
  std::string make_usage(const CLI::App*, std::string) const override { return ""; }
};

// The flags: what each one does with its value, and its line in --help.
void DefineFlags(CLI::App& app, SimOptions& o, const Vocabulary& vocabulary) {
  app.description(
      "Replays operator traces (the DTR prototype's JSON-lines format) through the remat engine under memory\n"
      "budgets and eviction policies, and reports one row per (trace, policy, ratio or budget).");
  app.footer(
      "With offload on, overhead includes the time ops waited for page-ins (transfer stall); the table, CSV and\n"
      "JSON give the offload mode, bytes paged out and in, and the stall.\n"
      "A table goes to stdout; a progress bar goes to stderr when it is a terminal.\n"
      "Exit status: 0 when every simulation ran (whatever its result: pass, oom or thrash), 2 for a command-line\n"
      "error, 1 for an unreadable or malformed trace or a failed output.");
  app.formatter(std::make_shared<HelpFormat>());
  app.get_formatter()->column_width(26);
  app.set_help_flag();  // --help sets SimOptions::help (below) rather than ending the parse
  app.allow_extras();   // unknown flags are reported by ParseSimOptions, in its words
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->disable_flag_override();

  // A flag with a value, which `parse` checks and stores; its error is the parse's.
  auto value = [&app](const char* flag, const char* type, const std::string& help,
                      std::function<absl::Status(const std::string&)> parse) {
    auto check = [parse = std::move(parse)](const std::string& text) {
      if (absl::Status status = parse(text); !status.ok()) throw CLI::ValidationError(std::string(status.message()));
    };
    app.add_option_function<std::string>(flag, check, help)->type_name(type);
  };
  app.add_option("TRACE", o.traces, "trace files (JSON lines, ../shared/traces/dtr/README.md)")->type_name("");
  value("--ratios", "R,...",
        "budgets as fractions of the unconstrained peak (constants included), each in\n"
        "(0, 1]; default 0.9,0.8,...,0.1",
        [&](const std::string& t) { return ParseList("--ratios", "ratio", t, ParseRatio, o.ratios); });
  value("--budgets", "SIZE,...", "absolute budgets with units, e.g. 4GiB,512MiB,1000000 (excludes --ratios)",
        [&](const std::string& t) {
          auto size = [](const std::string& i) { return ParseSize("--budgets", i); };
          return ParseList("--budgets", "budget", t, size, o.budgets);
        });
  value("--policies", "P,...",
        absl::StrCat("eviction policies (default ", vocabulary.default_policy, ")\nknown: ",
                     Quoted(vocabulary.policies)),
        [&](const std::string& t) {
          auto known = [&](const std::string& i) { return Known("--policies", "policy", vocabulary.policies, i); };
          return ParseList("--policies", "policy", t, known, o.policies);
        });
  value("--mode", "M",
        absl::StrCat("byte accounting: ", Quoted(vocabulary.modes), " (default ", vocabulary.default_mode, ")"),
        [&](const std::string& t) { return Set(Known("--mode", "mode", vocabulary.modes, t), o.mode); });
  value("--overhead-limit", "X",
        "a run whose compute exceeds X times the baseline is 'thrash' (default 2.0;\n<= 0 disables the check)",
        [&](const std::string& t) { return Set(ParseFiniteDouble("--overhead-limit", t), o.overhead_limit); });
  value("--out", "FILE", "write the rows as CSV (FILE.csv) or JSON (FILE.json)", [&](const std::string& t) {
    o.out = t;
    o.out_format = EndsIn(t, ".csv") ? OutFormat::kCsv : EndsIn(t, ".json") ? OutFormat::kJson : OutFormat::kNone;
    return o.out_format != OutFormat::kNone ? absl::OkStatus()
                                            : Bad("--out", absl::StrCat("'", t, "' must end in .csv or .json"));
  });
  value("--plot", "FILE.png",
        "plot overhead against memory ratio, one panel per trace, one line per policy\n"
        "(runs tools/plot_overhead.py with $REMAT_PYTHON, else $REMAT_VENV/bin/python,\n"
        "else ~/.cache/remat/venv/bin/python, else python3; needs matplotlib)",
        [&](const std::string& t) {
          o.plot = t;
          return EndsIn(t, ".png") ? absl::OkStatus() : Bad("--plot", absl::StrCat("'", t, "' must end in .png"));
        });
  value("--timeline", "FILE.png|FILE.json",
        "one run's memory over time: in use, paged out, evicted, released and\n"
        "rematerialized bytes, replays marked (JSON as remat.trace writes; .png also\n"
        "writes FILE.json and plots it with integration/python/remat/plot.py)",
        [&](const std::string& t) {
          o.timeline = t;
          return EndsIn(t, ".png") || EndsIn(t, ".json")
                     ? absl::OkStatus()
                     : Bad("--timeline", absl::StrCat("'", t, "' must end in .png or .json"));
        });
  value("--jobs", "N", "parallel simulations (default: one per core)", [&](const std::string& t) {
    return absl::SimpleAtoi(t, &o.jobs) && o.jobs >= 0 && o.jobs <= 1024
               ? absl::OkStatus()
               : Bad("--jobs", absl::StrCat("'", t, "' is not an integer in [0, 1024] (0: one per core)"));
  });
  value("--seed", "N", "seed for the random policy and for sampling (default 0)", [&](const std::string& t) {
    return absl::SimpleAtoi(t, &o.seed) && !absl::StartsWith(t, "-")
               ? absl::OkStatus()
               : Bad("--seed", absl::StrCat("'", t, "' is not a non-negative integer"));
  });
  app.add_flag("--sample-sqrt", o.sample_sqrt,
               "score only sqrt(n) random candidates per eviction (DTR prototype option)");
  app.add_flag("--ignore-small", o.ignore_small, "skip candidates smaller than 1% of the mean candidate size");
  app.add_flag("--dtr-paper", o.dtr_paper,
               "the DTR paper's engine (its simulator, simrd, exactly: released storages stay\n"
               "in the graph, evicted views replay their view op, writes copy, no deferral)\n"
               "instead of what remat runs under PyTorch (runtime/replay.h); parity needs it");
  app.add_flag_callback("--no-partition", [&o] { o.cheap_tensor_partitioning = false; },
                        "arena mode: no cheap-tensor partitioning (all blocks placed low)");
  value("--compact-first", "N",
        "arena mode: when the free bytes hold a request but no hole does, first slide\n"
        "blocks together if that moves at most N times the request (default 2;\n"
        "0: evict until a hole forms, compact only as the last resort)",
        [&](const std::string& t) {
          return absl::SimpleAtoi(t, &o.compact_first_limit) && !absl::StartsWith(t, "-") &&
                         o.compact_first_limit <= 1024
                     ? absl::OkStatus()
                     : Bad("--compact-first", absl::StrCat("'", t, "' is not an integer in [0, 1024]"));
        });
  value("--offload", "M,...",
        "paging to a second (host) tier: off, auto (page or drop, whichever the cost\n"
        "model prefers), always (page whenever the host tier has room); a comma list\n"
        "runs every mode and gives one row per mode (e.g. off,auto); default off",
        [&](const std::string& t) {
          auto mode = [](const std::string& i) -> absl::StatusOr<std::string> {
            if (ParseOffloadMode(i).ok()) return i;
            return Bad("--offload", absl::StrCat("unknown offload mode '", i,
                                                 "' (known: off, auto, always; a comma list compares modes)"));
          };
          return ParseList("--offload", "mode", t, mode, o.offload);
        });
  value("--bandwidth", "RATE",
        "link bandwidth, a byte size optionally followed by /s: 12GB/s, 12e9, 16GiB/s\n"
        "(default 12GB/s, V100 <-> pinned host memory as measured by Beaumont et al.)",
        [&](const std::string& t) { return Set(ParseBandwidth(t), o.bandwidth_bytes_per_s); });
  value("--link-latency", "TIME", "fixed cost per copy: 10us, 0.5ms, 250ns, 0 (default 10us)",
        [&](const std::string& t) { return Set(ParseDuration(t), o.link_latency_ns); });
  value("--host-budget", "SIZE", "second-tier capacity with units, e.g. 64GiB (default unlimited)",
        [&](const std::string& t) {
          return Set(ParseSize("--host-budget", t, " (omit the flag for unlimited)"), o.host_budget_bytes);
        });
  value("--granule", "SIZE",
        "stitch mode: granule of physical memory, a power of two with units, e.g. 2MiB\n"
        "(default 2MiB, CUDA's virtual memory granularity), 64KiB",
        [&](const std::string& t) {
          absl::Status s = Set(ParseSize("--granule", t, ""), o.granule_bytes);
          if (s.ok() && (o.granule_bytes < 512 || (o.granule_bytes & (o.granule_bytes - 1)) != 0)) {
            return Bad("--granule", absl::StrCat("the granule must be a power of two of at least 512 bytes, got '",
                                                 t, "'"));
          }
          return s;
        });
  app.add_flag("--page-constants", o.page_constants, "constants (weights) may be paged out too");
  app.add_flag("--duplex-link", o.duplex_link, "page-ins do not queue behind page-outs (one link per direction)");
  app.add_flag("--foresight", o.foresight,
               "the DTR family ranks by the ops until each candidate's next read in the trace\n"
               "instead of the time since its last access (what a recorded iteration could give)");
  value("--planner", "NAME,...",
        absl::StrCat("also plan each trace and budget offline and print the optimum next to\n"
                     "the policies, its schedule checked: checkmate (an ILP solved by HiGHS; with\n"
                     "--offload, drop or page), rotor (Rotor's DP on chains); known: ",
                     Quoted(vocabulary.planners)),
        [&](const std::string& t) {
          auto known = [&](const std::string& i) { return Known("--planner", "planner", vocabulary.planners, i); };
          return ParseList("--planner", "planner", t, known, o.planners);
        });
  value("--planner-time-limit", "SECONDS", "solver time limit per solve: 300, 90s, 5min (default 300)",
        [&](const std::string& t) {
          absl::string_view number = t;
          double scale = 1;
          if (absl::ConsumeSuffix(&number, "min")) {
            scale = 60;
          } else {
            absl::ConsumeSuffix(&number, "s");
          }
          double seconds = 0;
          if (!absl::SimpleAtod(number, &seconds) || !std::isfinite(seconds) || seconds <= 0) {
            return Bad("--planner-time-limit", absl::StrCat("'", t, "' is not a positive time (300, 90s, 5min)"));
          }
          o.planner_time_limit_s = seconds * scale;
          return absl::OkStatus();
        });
  value("--planner-max-binaries", "N", "refuse ILPs with more binaries than N (default 400000)",
        [&](const std::string& t) {
          return absl::SimpleAtoi(t, &o.planner_max_binaries) && o.planner_max_binaries > 0
                     ? absl::OkStatus()
                     : Bad("--planner-max-binaries", absl::StrCat("'", t, "' is not a positive integer"));
        });
  value("--segment", "FIRST+COUNT",
        "replace each trace by its window of COUNT ops from op FIRST (0-based; CALL and\n"
        "MUTATE counted): what is live at its start is made by recomputable segment_input\n"
        "ops, what is still referenced at its end is released (policies and planner alike)",
        [&](const std::string& t) {
          const std::size_t plus = t.find('+');
          if (plus == std::string::npos || !absl::SimpleAtoi(t.substr(0, plus), &o.segment_first) ||
              !absl::SimpleAtoi(t.substr(plus + 1), &o.segment_count) || o.segment_first < 0 ||
              o.segment_count <= 0 || absl::StartsWith(t, "-") || absl::StartsWith(t.substr(plus + 1), "-")) {
            return Bad("--segment", absl::StrCat("'", t, "' is not FIRST+COUNT (e.g. 0+100)"));
          }
          return absl::OkStatus();
        });
  app.add_flag("-h,--help", o.help, "this text");
}

}  // namespace

absl::StatusOr<SimOptions> ParseSimOptions(const std::vector<std::string>& args, const Vocabulary& vocabulary) {
  SimOptions options;
  options.mode = vocabulary.default_mode;
  CLI::App app;
  DefineFlags(app, options, vocabulary);
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes the arguments last first
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11's words for these two are "--ratios: 1 required R,... missing" and "sample-sqrt was given a
    // disallowed flag override".
    const std::string message = e.what();
    if (absl::StrContains(message, "flag override")) {
      return Bad(absl::StrCat("--", message.substr(0, message.find(' '))), "takes no value");
    }
    return Bad(message.substr(0, message.find(':')), "missing value");
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());  // a value's own error (ValidationError), already worded
  }
  for (const std::string& extra : app.remaining()) {
    if (extra == "--") continue;  // CLI11 lists the end of the flags too
    return absl::InvalidArgumentError(absl::StrCat("unknown option '", extra.substr(0, extra.find('=')),
                                                   "' (see --help)"));
  }
  if (options.help) return options;
  if (!options.ratios.empty() && !options.budgets.empty()) {
    return absl::InvalidArgumentError("--ratios and --budgets exclude each other; give one of them");
  }
  if (options.traces.empty()) return absl::InvalidArgumentError("no trace file given");
  for (std::size_t i = 0; i < options.traces.size(); ++i) {
    if (std::find(options.traces.begin(), options.traces.begin() + i, options.traces[i]) !=
        options.traces.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("trace '", options.traces[i], "' is given twice"));
    }
  }
  if (options.ratios.empty() && options.budgets.empty()) options.ratios = DefaultRatios();
  if (options.policies.empty()) options.policies = {vocabulary.default_policy};
  return options;
}

std::string UsageText(std::string_view program, const Vocabulary& vocabulary) {
  SimOptions options;
  CLI::App app("", std::string(program));
  DefineFlags(app, options, vocabulary);
  return app.help();
}

}  // namespace remat::sim
