// Per-op cost of remat in PyTorch (issue 6): a loop of small CPU ops in four modes, measured in one run.
//
//   build/bench/torch_overhead_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Modes (the benchmark name's last part):
//   off           plain ATen: the hook's key is not in the thread's included set.
//   pass_through  the dispatch hook on (ScopedHook) with no observer: every op goes through the boxed fallback,
//                 which redispatches below the key at once (integration/dispatch_hook.h).
//   recorder      the session without the engine (RematGuard, integration/session.h): the arena as torch's CPU
//                 allocator and the session's recording observer (counts, op time), nothing else. Shown for
//                 reference: it splits the engine mode's cost into "arena + recording" and "engine bookkeeping".
//   engine        the product path, what remat.enable() does (EngineGuard, integration/engine_session.h): the
//                 arena, the recording observer and the EngineBridge in front of it, which per op sweeps for dead
//                 storages, maps inputs and outputs to engine tensors, calls BeginOp/EndOp and keeps the record
//                 for replays. The budget (256 MiB for a few 256-byte tensors) is far above need, so nothing is
//                 evicted under pressure (the `evictions` counter checks it; every result that dies is still
//                 "released", which the engine does by evicting it, as in training). The "tracking" target
//                 applies to this mode.
//   history       engine, with the memory history on (remat.record_memory_history / remat.trace; integration/
//                 memory_events.h): every allocation, free, op and release also goes into the history's ring
//                 (1M events, wrapping). Its added cost over engine is what recording a picture of a run costs.
//
// Workloads (the name's first part), float32 8x8 on CPU, one thread; each iteration's results are dropped, so
// every op allocates a fresh output and frees it:
//   add   at::add(x, w)        mm   at::mm(x, w)        relu   at::relu(x)
//   mlp3  at::relu(at::add(at::mm(x, w), b)): 3 outermost ops per iteration (times are per iteration, the
//         summary divides by 3)
//   linear   at::linear(x, w, b): a composite op, seen as the 2 ops it calls (aten::t, aten::addmm) while its
//            arguments are held (dispatch_hook.h); per op, as mlp3
//   addmm_t  at::addmm(b, x, w.t()): the same 2 ops called directly; linear minus addmm_t is what the composite
//            itself costs
//   add_live1k  at::add(x, w) while 1,000 results of earlier ops (relu(w)) stay alive, as a model's tensors do
// and the same with autograd on ("_autograd": x, w, b require grad, so each op also builds its graph node).
// The inputs are made after the mode is entered (under recorder and engine they come from the arena, as
// activations would).
//
// Checks: pass_through is skipped with an error if an observer is installed, engine if the engine did not switch
// on. Counters: `recorded/op` is the number of ops the session recorded (RematStats::ops_recorded) per op run: 1
// under recorder and engine when they see every op exactly once, 0 otherwise; under engine, `engine/op` is the
// ops given to the engine per op run (BridgeStats::ops) and `evictions` the engine's pressure evictions (0: the
// budget never binds).
//
// An engine session keeps a record of every op whose output is recomputable, for the whole session: a run of N
// iterations leaves N records behind. The engine mode's figure therefore includes that growth, as a training
// step's ops do; its Google Benchmark runs last about --benchmark_min_time each (0.5 s by default), so an engine
// sees at most a few hundred thousand ops.
//
// After the Google Benchmark output, a summary gives per-op ns per mode (the median over repetitions when
// --benchmark_repetitions > 1, else the single run), by CPU time (the benchmark thread's, robust to other load
// on the machine) and by wall time, the added cost of each mode over off, and the targets (pass-through adds
// under 500 ns per op, engine tracking under 3000 ns).
//
// Paired ("<workload>/paired"): the five modes alternate every 64 iterations inside one benchmark (each round
// enters every mode in turn, rotated per round, with a fresh session each time); counters give, per op, each
// mode's median block (off, pass, rec, engine, hist) and the median over rounds of the paired differences (+pass,
// +rec, +engine, +hist), by wall clock. On a loaded machine these are the steadier figures: the modes see the same load
// within a round. The summary shows them too.
//
// Repetitions are randomly interleaved by default (--benchmark_enable_random_interleaving=true, put before the
// user's flags, so the user can switch it off): the modes of a workload then see the same drift in machine load
// instead of running minutes apart. Output is always the console format (colored on a terminal), summary
// included.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/linear.h>
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
#include "integration/engine_session.h"
#include "integration/memory_events.h"
#include "integration/session.h"

namespace remat::integration {
namespace {

constexpr std::size_t kBudget = std::size_t{256} << 20;
constexpr std::int64_t kSize = 8;
constexpr double kPassThroughTargetNs = 500;
constexpr double kTrackingTargetNs = 3000;

enum class Mode { kOff, kPassThrough, kRecorder, kEngine, kHistory };
constexpr Mode kModes[] = {Mode::kOff, Mode::kPassThrough, Mode::kRecorder, Mode::kEngine, Mode::kHistory};
constexpr std::size_t kHistoryEvents = std::size_t{1} << 20;
constexpr std::size_t kModeCount = sizeof kModes / sizeof kModes[0];

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kOff:
      return "off";
    case Mode::kPassThrough:
      return "pass_through";
    case Mode::kRecorder:
      return "recorder";
    case Mode::kEngine:
      return "engine";
    case Mode::kHistory:
      return "history";
  }
  return "?";
}

enum class Workload { kAdd, kMm, kRelu, kMlp3, kAddLive, kLinear, kAddmmT };
constexpr Workload kWorkloads[] = {Workload::kAdd,     Workload::kMm,     Workload::kRelu,  Workload::kMlp3,
                                   Workload::kAddLive, Workload::kLinear, Workload::kAddmmT};

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
    case Workload::kAddLive:
      return "add_live1k";
    case Workload::kLinear:
      return "linear";
    case Workload::kAddmmT:
      return "addmm_t";
  }
  return "?";
}

int OpsPerIteration(Workload workload) {
  switch (workload) {
    case Workload::kMlp3:
      return 3;
    case Workload::kLinear:
    case Workload::kAddmmT:
      return 2;  // aten::t and aten::addmm
    default:
      return 1;
  }
}

// add_live1k holds this many live results of recorded ops (as a model's activations and weights are live while
// it trains): what remat does per op for each live storage shows.
constexpr int kLiveTensors = 1000;

struct Inputs {
  at::Tensor x;
  at::Tensor w;
  at::Tensor b;
  std::vector<at::Tensor> live;  // add_live1k only
};

Inputs MakeInputs(Workload workload, bool autograd) {
  Inputs in{at::randn({kSize, kSize}), at::randn({kSize, kSize}), at::randn({kSize, kSize}), {}};
  if (autograd) {
    in.x.set_requires_grad(true);
    in.w.set_requires_grad(true);
    in.b.set_requires_grad(true);
  }
  if (workload == Workload::kAddLive) {
    for (int i = 0; i < kLiveTensors; ++i) in.live.push_back(at::relu(in.w));
  }
  return in;
}

template <Workload kWorkload>
at::Tensor RunOnce(const Inputs& in) {
  if constexpr (kWorkload == Workload::kAdd || kWorkload == Workload::kAddLive) {
    return at::add(in.x, in.w);
  } else if constexpr (kWorkload == Workload::kMm) {
    return at::mm(in.x, in.w);
  } else if constexpr (kWorkload == Workload::kRelu) {
    return at::relu(in.x);
  } else if constexpr (kWorkload == Workload::kLinear) {
    return at::linear(in.x, in.w, in.b);
  } else if constexpr (kWorkload == Workload::kAddmmT) {
    return at::addmm(in.b, in.x, in.w.t());
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
        case Mode::kRecorder: {
          RematOptions options;
          options.budget = kBudget;
          guard_.emplace(options);
          if (!RematEnabled() || GetObserver() == nullptr) error_ = "remat enabled but no observer installed";
          break;
        }
        case Mode::kEngine:
        case Mode::kHistory: {
          EngineSessionOptions options;
          options.budget = kBudget;
          engine_.emplace(options);
          if (!RematEngineEnabled() || !HookEnabledOnThisThread() || GetObserver() == nullptr) {
            error_ = "the engine session is not on (engine, hook and observer)";
          }
          if (mode == Mode::kHistory) {
            StartMemoryHistory(kHistoryEvents);
            history_ = true;
          }
          break;
        }
      }
    } catch (const c10::Error& e) {
      error_ = e.what_without_backtrace();
    }
  }
  ~ModeScope() {
    if (history_) StopMemoryHistory();
  }
  ModeScope(const ModeScope&) = delete;
  ModeScope& operator=(const ModeScope&) = delete;
  const std::string& error() const { return error_; }

 private:
  bool history_ = false;
  std::optional<ScopedHook> hook_;
  std::optional<RematGuard> guard_;
  std::optional<EngineGuard> engine_;
  std::string error_;
};

// The running engine's statistics in engine mode, else nothing.
std::optional<BridgeStats> EngineStatsIfOn(Mode mode) {
  if ((mode != Mode::kEngine && mode != Mode::kHistory) || !RematEngineEnabled()) return std::nullopt;
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  if (!stats.ok()) return std::nullopt;
  return *stats;
}

template <Workload kWorkload>
void BM_Ops(benchmark::State& state, Mode mode, bool autograd) {
  const ModeScope scope(mode);
  if (!scope.error().empty()) {
    state.SkipWithError(scope.error().c_str());
    return;
  }
  {
    const Inputs in = MakeInputs(kWorkload, autograd);  // destroyed before the scope leaves the mode
    const std::uint64_t recorded_before = GetRematStats().ops_recorded;  // changes only while remat is enabled
    const std::optional<BridgeStats> engine_before = EngineStatsIfOn(mode);
    for (auto _ : state) {
      at::Tensor out = RunOnce<kWorkload>(in);
      benchmark::DoNotOptimize(out);
    }
    const double ops = static_cast<double>(state.iterations()) * OpsPerIteration(kWorkload);
    if (ops > 0) {
      state.counters["recorded/op"] = static_cast<double>(GetRematStats().ops_recorded - recorded_before) / ops;
      const std::optional<BridgeStats> engine_after = EngineStatsIfOn(mode);
      if (engine_before.has_value() && engine_after.has_value()) {
        state.counters["engine/op"] = static_cast<double>(engine_after->ops - engine_before->ops) / ops;
        state.counters["evictions"] = static_cast<double>(engine_after->engine.evictions);
      }
    }
  }
  state.counters["ops/iter"] = OpsPerIteration(kWorkload);
}

// Paired: the modes alternate in short blocks inside one benchmark, so they see the same machine load.
// Each iteration is one round: every mode in turn (rotated per round) is entered, fresh inputs are made and
// kPairedWarmup iterations run untimed, then kPairedBlock iterations are timed with the wall clock. Counters,
// per op: the median block of each mode, and the median over rounds of the paired differences (+pass, +rec,
// +engine).
// The benchmark's own time is per round, mode switches (EnableRemat/DisableRemat) included: ignore it.
constexpr int kPairedRounds = 200;
constexpr int kPairedBlock = 64;
constexpr int kPairedWarmup = 8;
// Counter names of the paired benchmark, indexed like kModes ("+<name>": the paired difference to off).
constexpr const char* kPairedCounters[] = {"off", "pass", "rec", "engine", "hist"};
static_assert(sizeof kPairedCounters / sizeof kPairedCounters[0] == kModeCount);

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

template <Workload kWorkload>
void BM_Paired(benchmark::State& state, bool autograd) {
  std::array<std::vector<double>, kModeCount> per_op;  // ns, indexed like kModes
  std::size_t round = 0;
  for (auto _ : state) {
    bool failed = false;
    for (std::size_t i = 0; i < kModeCount && !failed; ++i) {
      const std::size_t m = (round + i) % kModeCount;
      const ModeScope scope(kModes[m]);
      if (!scope.error().empty()) {
        state.SkipWithError(scope.error().c_str());
        failed = true;
        break;
      }
      const Inputs in = MakeInputs(kWorkload, autograd);
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
  std::array<std::vector<double>, kModeCount> added;  // paired differences to off, per round
  for (std::size_t r = 0; r < round; ++r) {
    for (std::size_t m = 1; m < kModeCount; ++m) added[m].push_back(per_op[m][r] - per_op[0][r]);
  }
  for (std::size_t m = 0; m < kModeCount; ++m) {
    state.counters[kPairedCounters[m]] = Median(per_op[m]);
    if (m > 0) state.counters[std::string("+") + kPairedCounters[m]] = Median(added[m]);
  }
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
    Register<Workload::kAddLive>(autograd);
    Register<Workload::kLinear>(autograd);
    Register<Workload::kAddmmT>(autograd);
  }
}

// The added cost a mode must stay under (issue 6), indexed like kModes; none (0) for off and for recorder, which
// is shown only to split the engine mode's cost.
constexpr double kTargetsNs[] = {0, kPassThroughTargetNs, 0, kTrackingTargetNs, 0};
static_assert(sizeof kTargetsNs / sizeof kTargetsNs[0] == kModeCount);

// The console output, then a per-op summary of the modes side by side.
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
        for (std::size_t m = 0; m < kModeCount; ++m) {
          for (const std::string& counter : {std::string(kPairedCounters[m]), "+" + std::string(kPairedCounters[m])}) {
            const auto found = run.counters.find(counter);
            if (found != run.counters.end()) paired.values[counter] = static_cast<double>(found->second);
          }
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
      PrintHeader(out);
      for (const std::string& row : SummaryRows()) {
        if (rows_.find(row) == rows_.end()) continue;  // filtered out, or every mode failed
        std::map<std::string, Cell>& cells = rows_[row];
        auto value = [cpu](const Cell& c) { return cpu ? c.cpu_ns : c.wall_ns; };
        const Cell& off = cells["off"];
        Print(out, "%-16s ", row.c_str());
        PrintValue(out, off.present, value(off), 9);
        for (std::size_t m = 1; m < kModeCount; ++m) {
          const Cell& cell = cells[ModeName(kModes[m])];
          PrintValue(out, cell.present, value(cell), 12);
          PrintAdded(out, off.present && cell.present, value(cell) - value(off), kTargetsNs[m]);
        }
        out << "\n";
      }
    }
    if (!paired_.empty()) {
      Print(out,
            "\nPaired (modes alternate every %d iterations; per op: median block, median paired difference), "
            "ns wall:\n",
            kPairedBlock);
      PrintHeader(out);
      for (const std::string& row : SummaryRows()) {
        const auto found = paired_.find(row);
        if (found == paired_.end()) continue;
        std::map<std::string, double> v = found->second.values;
        Print(out, "%-16s ", row.c_str());
        PrintValue(out, v.count("off") > 0, v["off"], 9);
        for (std::size_t m = 1; m < kModeCount; ++m) {
          const std::string name = kPairedCounters[m];
          PrintValue(out, v.count(name) > 0, v[name], 12);
          PrintAdded(out, v.count("+" + name) > 0, v["+" + name], kTargetsNs[m]);
        }
        out << "\n";
      }
    }
    Print(out,
          "\nTargets (issue 6): pass_through adds under %.0f ns per op, engine (tracking, the product path) under "
          "%.0f ns ('!' marks an added cost over its target; recorder has none, it is the engine mode without the "
          "engine).\n",
          kPassThroughTargetNs, kTrackingTargetNs);
  }

 private:
  static void PrintHeader(std::ostream& out) {
    Print(out, "%-16s %9s ", "workload", "off");
    for (std::size_t m = 1; m < kModeCount; ++m) Print(out, "%12s %10s ", ModeName(kModes[m]), "added");
    out << "\n";
  }

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
      Print(out, "%+9.0f%s ", added, target <= 0 || added < target ? " " : "!");
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
