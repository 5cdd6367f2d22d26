// Per-op cost of remat in PyTorch (issue 6): a loop of small CPU ops in three modes, measured in one run.
//
//   build/bench/torch_overhead_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Modes (the benchmark name's last part):
//   off           plain ATen: the hook's key is not in the thread's included set.
//   pass_through  the dispatch hook on (ScopedHook) with no observer: every op goes through the boxed fallback,
//                 which redispatches below the key at once (integration/dispatch_hook.h).
//   tracking      remat enabled through the public C++ API (RematGuard, integration/session.h) with a budget far
//                 above need (256 MiB for a few 256-byte tensors): what the product does for every op. The arena
//                 is torch's CPU allocator here, so this mode's figure includes the arena in place of torch's
//                 default CPU allocator, plus whatever the session's observer does per op at the time of building.
//
// Workloads (the name's first part), float32 8x8 on CPU, one thread; each iteration's results are dropped, so
// every op allocates a fresh output and frees it:
//   add   at::add(x, w)        mm   at::mm(x, w)        relu   at::relu(x)
//   mlp3  at::relu(at::add(at::mm(x, w), b)): 3 outermost ops per iteration (times are per iteration, the
//         summary divides by 3)
// and the same with autograd on ("_autograd": x, w, b require grad, so each op also builds its graph node).
// The inputs are made after the mode is entered (under tracking they come from the arena, as activations would).
//
// Checks: pass_through is skipped with an error if an observer is installed; `recorded/op` is the number of ops
// the session recorded (RematStats::ops_recorded) per op run: 1 under tracking when it sees every op exactly once,
// 0 in the other modes.
//
// After the Google Benchmark output, a summary gives per-op ns per mode (the median over repetitions when
// --benchmark_repetitions > 1, else the single run), by CPU time (the benchmark thread's, robust to other load
// on the machine) and by wall time, the added cost of pass_through and tracking over off, and the targets
// (pass-through adds under 500 ns per op, tracking under 3000 ns).
//
// Paired ("<workload>/paired"): the three modes alternate every 64 iterations inside one benchmark (each round
// enters every mode in turn, rotated per round); counters give, per op, each mode's median block (off, pass,
// track) and the median over rounds of the paired differences (+pass, +track), by wall clock. On a loaded machine
// these are the steadier figures: the modes see the same load within a round. The summary shows them too.
//
// Repetitions are randomly interleaved by default (--benchmark_enable_random_interleaving=true, put before the
// user's flags, so the user can switch it off): the three modes of a workload then see the same drift in machine
// load instead of running minutes apart. Output is always the console format (colored on a terminal), summary
// included.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <benchmark/benchmark.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "integration/dispatch_hook.h"
#include "integration/session.h"

namespace remat::integration {
namespace {

constexpr std::size_t kBudget = std::size_t{256} << 20;
constexpr std::int64_t kSize = 8;
constexpr double kPassThroughTargetNs = 500;
constexpr double kTrackingTargetNs = 3000;

enum class Mode { kOff, kPassThrough, kTracking };
constexpr Mode kModes[] = {Mode::kOff, Mode::kPassThrough, Mode::kTracking};

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kOff:
      return "off";
    case Mode::kPassThrough:
      return "pass_through";
    case Mode::kTracking:
      return "tracking";
  }
  return "?";
}

enum class Workload { kAdd, kMm, kRelu, kMlp3 };
constexpr Workload kWorkloads[] = {Workload::kAdd, Workload::kMm, Workload::kRelu, Workload::kMlp3};

const char* WorkloadName(Workload workload) {
  switch (workload) {
    case Workload::kAdd:
      return "add";
    case Workload::kMm:
      return "mm";
    case Workload::kRelu:
      return "relu";
    case Workload::kMlp3:
      return "mlp3";
  }
  return "?";
}

int OpsPerIteration(Workload workload) { return workload == Workload::kMlp3 ? 3 : 1; }

struct Inputs {
  at::Tensor x;
  at::Tensor w;
  at::Tensor b;
};

Inputs MakeInputs(bool autograd) {
  Inputs in{at::randn({kSize, kSize}), at::randn({kSize, kSize}), at::randn({kSize, kSize})};
  if (autograd) {
    in.x.set_requires_grad(true);
    in.w.set_requires_grad(true);
    in.b.set_requires_grad(true);
  }
  return in;
}

template <Workload kWorkload>
at::Tensor RunOnce(const Inputs& in) {
  if constexpr (kWorkload == Workload::kAdd) {
    return at::add(in.x, in.w);
  } else if constexpr (kWorkload == Workload::kMm) {
    return at::mm(in.x, in.w);
  } else if constexpr (kWorkload == Workload::kRelu) {
    return at::relu(in.x);
  } else {
    return at::relu(at::add(at::mm(in.x, in.w), in.b));
  }
}

// Enters `mode` for its lifetime, or says why it could not.
class ModeScope {
 public:
  explicit ModeScope(Mode mode) {
    try {
      switch (mode) {
        case Mode::kOff:
          if (HookEnabledOnThisThread()) error_ = "the hook is enabled on this thread: not off";
          break;
        case Mode::kPassThrough:
          if (GetObserver() != nullptr) {
            error_ = "an observer is installed: not pass-through";
            break;
          }
          hook_.emplace();
          if (!HookEnabledOnThisThread()) error_ = "the hook did not switch on";
          break;
        case Mode::kTracking: {
          RematOptions options;
          options.budget = kBudget;
          guard_.emplace(options);
          if (!RematEnabled() || GetObserver() == nullptr) error_ = "remat enabled but no observer installed";
          break;
        }
      }
    } catch (const c10::Error& e) {
      error_ = e.what_without_backtrace();
    }
  }
  const std::string& error() const { return error_; }

 private:
  std::optional<ScopedHook> hook_;
  std::optional<RematGuard> guard_;
  std::string error_;
};

template <Workload kWorkload>
void BM_Ops(benchmark::State& state, Mode mode, bool autograd) {
  const ModeScope scope(mode);
  if (!scope.error().empty()) {
    state.SkipWithError(scope.error().c_str());
    return;
  }
  {
    const Inputs in = MakeInputs(autograd);  // destroyed before the scope leaves the mode
    const std::uint64_t recorded_before = GetRematStats().ops_recorded;  // changes only while remat is enabled
    for (auto _ : state) {
      at::Tensor out = RunOnce<kWorkload>(in);
      benchmark::DoNotOptimize(out);
    }
    const double ops = static_cast<double>(state.iterations()) * OpsPerIteration(kWorkload);
    if (ops > 0) {
      state.counters["recorded/op"] = static_cast<double>(GetRematStats().ops_recorded - recorded_before) / ops;
    }
  }
  state.counters["ops/iter"] = OpsPerIteration(kWorkload);
}

// Paired: the three modes alternate in short blocks inside one benchmark, so they see the same machine load.
// Each iteration is one round: every mode in turn (rotated per round) is entered, fresh inputs are made and
// kPairedWarmup iterations run untimed, then kPairedBlock iterations are timed with the wall clock. Counters,
// per op: the median block of each mode, and the median over rounds of the paired differences (+pass, +track).
// The benchmark's own time is per round, mode switches (EnableRemat/DisableRemat) included: ignore it.
constexpr int kPairedRounds = 200;
constexpr int kPairedBlock = 64;
constexpr int kPairedWarmup = 8;

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

template <Workload kWorkload>
void BM_Paired(benchmark::State& state, bool autograd) {
  std::array<std::vector<double>, 3> per_op;  // ns, indexed like kModes
  std::size_t round = 0;
  for (auto _ : state) {
    bool failed = false;
    for (std::size_t i = 0; i < 3 && !failed; ++i) {
      const std::size_t m = (round + i) % 3;
      const ModeScope scope(kModes[m]);
      if (!scope.error().empty()) {
        state.SkipWithError(scope.error().c_str());
        failed = true;
        break;
      }
      const Inputs in = MakeInputs(autograd);
      for (int k = 0; k < kPairedWarmup; ++k) benchmark::DoNotOptimize(RunOnce<kWorkload>(in));
      const auto start = std::chrono::steady_clock::now();
      for (int k = 0; k < kPairedBlock; ++k) benchmark::DoNotOptimize(RunOnce<kWorkload>(in));
      const auto stop = std::chrono::steady_clock::now();
      per_op[m].push_back(std::chrono::duration<double, std::nano>(stop - start).count() /
                          (kPairedBlock * OpsPerIteration(kWorkload)));
    }
    if (failed) break;
    ++round;
  }
  if (round == 0) return;
  std::vector<double> pass_added, track_added;
  for (std::size_t r = 0; r < round; ++r) {
    pass_added.push_back(per_op[1][r] - per_op[0][r]);
    track_added.push_back(per_op[2][r] - per_op[0][r]);
  }
  state.counters["off"] = Median(per_op[0]);
  state.counters["pass"] = Median(per_op[1]);
  state.counters["track"] = Median(per_op[2]);
  state.counters["+pass"] = Median(pass_added);
  state.counters["+track"] = Median(track_added);
}

// Workload rows in registration order, for the summary (repetitions arrive in random order).
std::vector<std::string>& SummaryRows() {
  static auto* rows = new std::vector<std::string>();
  return *rows;
}

template <Workload kWorkload>
void Register(bool autograd) {
  const std::string row = std::string(WorkloadName(kWorkload)) + (autograd ? "_autograd" : "");
  SummaryRows().push_back(row);
  for (const Mode mode : kModes) {
    const std::string name = row + "/" + ModeName(mode);
    benchmark::RegisterBenchmark(name.c_str(), BM_Ops<kWorkload>, mode, autograd)->Unit(benchmark::kNanosecond);
  }
  benchmark::RegisterBenchmark((row + "/paired").c_str(), BM_Paired<kWorkload>, autograd)
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(kPairedRounds);
}

void RegisterAll() {
  for (const bool autograd : {false, true}) {
    Register<Workload::kAdd>(autograd);
    Register<Workload::kMm>(autograd);
    Register<Workload::kRelu>(autograd);
    Register<Workload::kMlp3>(autograd);
  }
}

// The console output, then a per-op summary of the three modes side by side.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  SummaryReporter()
      : benchmark::ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    benchmark::ConsoleReporter::ReportRuns(reports);
    for (const Run& run : reports) {
      if (run.error_occurred) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (!median && !single) continue;
      const std::string& name = run.run_name.function_name;
      const std::size_t slash = name.rfind('/');
      if (slash == std::string::npos) continue;
      if (name.substr(slash + 1) == "paired") {
        Paired& paired = paired_[name.substr(0, slash)];
        for (const char* counter : {"off", "pass", "track", "+pass", "+track"}) {
          const auto found = run.counters.find(counter);
          if (found != run.counters.end()) paired.values[counter] = static_cast<double>(found->second);
        }
        continue;
      }
      const auto ops = run.counters.find("ops/iter");
      const double per_iteration = ops == run.counters.end() ? 1.0 : static_cast<double>(ops->second);
      Cell& cell = rows_[name.substr(0, slash)][name.substr(slash + 1)];
      cell.cpu_ns = run.GetAdjustedCPUTime() / per_iteration;
      cell.wall_ns = run.GetAdjustedRealTime() / per_iteration;
      cell.present = true;
    }
  }

  void Finalize() override {
    benchmark::ConsoleReporter::Finalize();
    std::ostream& out = GetOutputStream();
    for (const bool cpu : {true, false}) {
      if (rows_.empty()) break;
      Print(out, "\nPer-op cost, ns (%s time; median over repetitions):\n", cpu ? "CPU" : "wall");
      Print(out, "%-16s %9s %14s %10s %14s %10s\n", "workload", "off", "pass_through", "added", "tracking", "added");
      for (const std::string& row : SummaryRows()) {
        if (rows_.find(row) == rows_.end()) continue;  // filtered out, or every mode failed
        std::map<std::string, Cell>& cells = rows_[row];
        const Cell& off = cells["off"];
        const Cell& pass = cells["pass_through"];
        const Cell& track = cells["tracking"];
        auto value = [cpu](const Cell& c) { return cpu ? c.cpu_ns : c.wall_ns; };
        Print(out, "%-16s ", row.c_str());
        PrintValue(out, off.present, value(off), 9);
        PrintValue(out, pass.present, value(pass), 14);
        PrintAdded(out, off.present && pass.present, value(pass) - value(off), kPassThroughTargetNs);
        PrintValue(out, track.present, value(track), 14);
        PrintAdded(out, off.present && track.present, value(track) - value(off), kTrackingTargetNs);
        out << "\n";
      }
    }
    if (!paired_.empty()) {
      Print(out,
            "\nPaired (modes alternate every %d iterations; per op: median block, median paired difference), "
            "ns wall:\n",
            kPairedBlock);
      Print(out, "%-16s %9s %14s %10s %14s %10s\n", "workload", "off", "pass_through", "added", "tracking", "added");
      for (const std::string& row : SummaryRows()) {
        const auto found = paired_.find(row);
        if (found == paired_.end()) continue;
        std::map<std::string, double> v = found->second.values;
        Print(out, "%-16s ", row.c_str());
        PrintValue(out, v.count("off") > 0, v["off"], 9);
        PrintValue(out, v.count("pass") > 0, v["pass"], 14);
        PrintAdded(out, v.count("+pass") > 0, v["+pass"], kPassThroughTargetNs);
        PrintValue(out, v.count("track") > 0, v["track"], 14);
        PrintAdded(out, v.count("+track") > 0, v["+track"], kTrackingTargetNs);
        out << "\n";
      }
    }
    Print(out,
          "\nTargets (issue 6): pass-through adds under %.0f ns per op, tracking under %.0f ns "
          "('!' marks an added cost over its target).\n",
          kPassThroughTargetNs, kTrackingTargetNs);
  }

 private:
  template <typename... Args>
  static void Print(std::ostream& out, const char* format, Args... args) {
    char buffer[256];
    std::snprintf(buffer, sizeof buffer, format, args...);
    out << buffer;
  }

  struct Cell {
    bool present = false;
    double cpu_ns = 0;
    double wall_ns = 0;
  };

  static void PrintValue(std::ostream& out, bool present, double value, int width) {
    if (present) {
      Print(out, "%*.0f ", width, value);
    } else {
      Print(out, "%*s ", width, "-");
    }
  }
  static void PrintAdded(std::ostream& out, bool present, double added, double target) {
    if (present) {
      Print(out, "%+9.0f%s ", added, added < target ? " " : "!");
    } else {
      Print(out, "%10s ", "-");
    }
  }

  struct Paired {
    std::map<std::string, double> values;
  };

  std::map<std::string, std::map<std::string, Cell>> rows_;
  std::map<std::string, Paired> paired_;
};

}  // namespace
}  // namespace remat::integration

int main(int argc, char** argv) {
  // Defaults go before the user's flags: a later flag wins.
  static char interleave[] = "--benchmark_enable_random_interleaving=true";
  std::vector<char*> args;
  args.push_back(argv[0]);
  args.push_back(interleave);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  remat::integration::RegisterAll();
  remat::integration::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
