// Replay: the simulated executor and the driver that feeds a Trace through the engine.
#include "runtime/replay.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "policies/registry.h"
#include "runtime/plan_guide.h"
#include "runtime/plan_mode.h"
#include "runtime/sim_executor.h"
#include "runtime/trace_future.h"
#include "absl/strings/str_cat.h"

namespace remat {

std::string_view ToString(ReplayStatus status) {
  switch (status) {
    case ReplayStatus::kPass: return "pass";
    case ReplayStatus::kOom: return "oom";
    case ReplayStatus::kThrash: return "thrash";
    case ReplayStatus::kError: return "error";
  }
  return "error";
}

std::string_view ToString(AccountingMode mode) {
  return mode == AccountingMode::kCounter ? "counter" : "arena";
}

absl::StatusOr<AccountingMode> ParseAccountingMode(std::string_view text) {
  if (text == "counter") return AccountingMode::kCounter;
  if (text == "arena") return AccountingMode::kArena;
  return absl::InvalidArgumentError(absl::StrCat("unknown accounting mode '", std::string(text), "' (counter|arena)"));
}

struct Replayer::Impl {
  const Trace* trace = nullptr;
  Baseline baselines[2];  // by EngineConfig
};

namespace {

ReplayResult Fail(ReplayResult r, ReplayStatus status, std::string message) {
  r.status = status;
  r.message = std::move(message);
  return r;
}

// How Drive feeds the trace to the engine.
struct DriveOptions {
  bool product = true;       // the engine configuration (ReplayOptions::engine): kProduct when true
  int prefetch_ops = 0;      // > 0: before each op, prefetch the paged inputs of the next prefetch_ops ops
  bool prefetch_evicts = false;  // see ReplayOptions
  SimExecutor* executor = nullptr;  // the engine's; product, arena mode: ops' outputs are placed through it
  std::function<void()> after_op;  // when set, called after every CALL and MUTATE (timelines)
  // When set, the engine op id of every CALL and MUTATE is appended after it ran, as -1 - id (schedules).
  std::vector<std::int64_t>* op_log = nullptr;
  bool foresight = false;  // ReplayOptions::foresight
  PlanRecorder* recorder = nullptr;  // ReplayOptions::record_plan
  PlanFollower* follower = nullptr;  // ReplayOptions::follow_plan
};

// Runs the trace through `engine`. Returns OK, or the engine's error (ResourceExhausted / Aborted / other).
// Prefetching goes through the names bound now (a name rebound in between only costs a useless prefetch).
absl::Status Drive(const Trace& trace, Engine& engine, const DriveOptions& drive) {
  const int prefetch_ops = drive.prefetch_ops;
  const bool prefetch_evicts = drive.prefetch_evicts;
  const std::function<void()>& after_op = drive.after_op;
  std::vector<std::size_t> calls;  // indices of CALL and MUTATE instructions
  if (prefetch_ops > 0) {
    for (std::size_t i = 0; i < trace.ops.size(); ++i) {
      if (trace.ops[i].kind == TraceOpKind::kCall || trace.ops[i].kind == TraceOpKind::kMutate) calls.push_back(i);
    }
  }
  std::size_t next_call = 0;  // position in `calls` of the first call not yet run
  std::vector<std::int64_t> bound(trace.names.size(), -1);  // trace name -> tensor
  std::vector<TraceName> order;                             // names in order of first binding
  order.reserve(trace.names.size());
  std::vector<TensorId> inputs;
  std::vector<OutputSpec> outputs;
  std::optional<TraceFuture> future;  // --foresight: the engine reads what the rest of the trace will read
  struct ForgetFuture {
    Engine& engine;
    ~ForgetFuture() { engine.SetFuture(nullptr); }
  } forget{engine};
  if (drive.foresight) {
    future.emplace(trace, engine, bound);
    engine.SetFuture(&*future);
  }
  // Plan mode: after each CALL and MUTATE, the recorder and the follower learn the storages it made.
  std::vector<StorageIndex> made_storages;
  struct ForgetPlan {
    Engine& engine;
    ~ForgetPlan() { engine.SetPlan(nullptr); }
  } forget_plan{engine};
  if (drive.follower != nullptr) engine.SetPlan(drive.follower);
  auto note_made = [&](std::string_view name) {
    if (drive.recorder != nullptr) drive.recorder->OnOp(engine, name, made_storages);
    if (drive.follower != nullptr) {
      std::int64_t bytes = 0;
      for (StorageIndex s : made_storages) bytes += engine.StorageBytes(s);
      if (!drive.follower->OnOp(name, made_storages, bytes)) engine.SetPlan(nullptr);
    }
  };
  auto bind = [&](TraceName n, TensorId t) {
    if (bound[n] < 0) order.push_back(n);
    bound[n] = t;
    if (future) future->Bind(n, t);
  };
  auto lookup = [&](TraceName n, const TraceOp& op, TensorId& out) -> absl::Status {
    if (bound[n] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(trace.path, ":", op.line, ": name '", trace.names[n], "' is not bound"));
    }
    out = static_cast<TensorId>(bound[n]);
    return absl::OkStatus();
  };
  bool backward = false;  // inside a backward pass (product: its outputs are deferred)
  auto defer_in_backward = [&](std::span<const TensorId> outs) {
    if (!drive.product || !backward) return;
    for (TensorId t : outs) engine.Defer(t);
  };
  // Product, arena mode: an op runs as the PyTorch path runs it. BeginOp brings its inputs back and locks them, the
  // kernel allocates its fresh outputs from the arena one by one (the engine makes room when one does not fit),
  // and EndOp registers them where they were placed.
  auto call_as_kernel = [&](const TraceOp& op) -> absl::StatusOr<std::span<const TensorId>> {
    absl::StatusOr<OpId> begun = engine.BeginOp(inputs, op.op_name);
    if (!begun.ok()) return begun.status();
    engine.NoteAllocation();
    outputs.clear();
    for (const TraceResult& r : op.results) {
      OutputSpec spec{r.alias >= 0 ? 0 : r.bytes, r.alias};
      if (r.alias < 0) {
        absl::StatusOr<std::uintptr_t> address = drive.executor->AllocateForKernel(engine, *begun, r.bytes);
        if (!address.ok()) {
          for (const OutputSpec& placed : outputs) {
            if (placed.alias < 0) drive.executor->FreeBlock(placed.address);
          }
          engine.AbortOp(*begun);
          return address.status();
        }
        spec.address = *address;
      }
      outputs.push_back(spec);
    }
    absl::StatusOr<std::span<const TensorId>> outs = engine.EndOp(*begun, outputs, op.time_ns);
    if (!outs.ok()) return outs.status();
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].alias < 0) drive.executor->Adopt(engine, engine.StorageOf((*outs)[i]));
    }
    return outs;
  };
  // Product: a MUTATE writes in place, as the PyTorch path runs it: each written storage (once, whatever the names
  // on it) now holds a new value made by this op. DTR paper: copy-on-write, each mutated argument becomes a fresh
  // storage of its storage's size. `written` gets the ARGS index of each output.
  std::vector<std::int32_t> written;
  auto mutate = [&](const TraceOp& op) -> absl::StatusOr<std::span<const TensorId>> {
    written.clear();
    outputs.clear();
    for (std::int32_t k : op.mutated) {
      if (!drive.product) {
        written.push_back(k);
        outputs.push_back({engine.StorageBytes(engine.StorageOf(inputs[k])), -1});
        continue;
      }
      bool seen = false;
      for (std::int32_t w : written) seen = seen || engine.StorageOf(inputs[w]) == engine.StorageOf(inputs[k]);
      if (seen) continue;
      written.push_back(k);
      OutputSpec spec;
      spec.in_place_of = k;
      outputs.push_back(spec);
    }
    if (!drive.product) return engine.Call(inputs, outputs, op.time_ns, op.op_name);
    absl::StatusOr<OpId> begun = engine.BeginOp(inputs, op.op_name);
    if (!begun.ok()) return begun.status();
    return engine.EndOp(*begun, outputs, op.time_ns);
  };
  auto gather_inputs = [&](const TraceOp& op) -> absl::Status {
    inputs.clear();
    for (TraceName a : op.args) {
      TensorId t;
      if (absl::Status s = lookup(a, op, t); !s.ok()) return s;
      inputs.push_back(t);
    }
    return absl::OkStatus();
  };
  auto constant = [&](const TraceOp& op) -> absl::Status {
    absl::StatusOr<TensorId> t = engine.Constant(op.bytes);
    if (!t.ok()) return t.status();
    bind(op.name, *t);
    return absl::OkStatus();
  };
  std::vector<TensorId> upcoming;
  auto prefetch = [&]() -> absl::Status {
    upcoming.clear();
    for (std::size_t k = next_call + 1; k < calls.size() && k <= next_call + static_cast<std::size_t>(prefetch_ops);
         ++k) {
      for (TraceName a : trace.ops[calls[k]].args) {
        if (bound[a] >= 0) upcoming.push_back(static_cast<TensorId>(bound[a]));
      }
    }
    ++next_call;
    absl::StatusOr<int> issued = engine.PrefetchAhead(upcoming, prefetch_evicts);
    return issued.status();
  };
  // Product: every constant is in memory when the replay starts, as the PyTorch path has the parameters and state
  // a recording found (declared where first used, they would be placed among the activations).
  std::vector<bool> hoisted(trace.ops.size(), false);
  if (drive.product) {
    for (std::size_t i = 0; i < trace.ops.size(); ++i) {
      const TraceOp& op = trace.ops[i];
      if (op.kind != TraceOpKind::kConstant || bound[op.name] >= 0) continue;
      if (absl::Status s = constant(op); !s.ok()) return s;
      hoisted[i] = true;
    }
  }
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    if (hoisted[i]) continue;
    if (future && (op.kind == TraceOpKind::kCall || op.kind == TraceOpKind::kMutate)) future->Advance();
    if (!calls.empty() && (op.kind == TraceOpKind::kCall || op.kind == TraceOpKind::kMutate)) {
      if (absl::Status s = prefetch(); !s.ok()) return s;
    }
    switch (op.kind) {
      case TraceOpKind::kAnnotate:
        if (op.op_name == "BACKWARD") backward = true;
        if (op.op_name == "FORWARD") backward = false;
        break;
      case TraceOpKind::kPin: {
        if (!drive.product) break;
        TensorId t;
        if (absl::Status s = lookup(op.args[0], op, t); !s.ok()) return s;
        if (!engine.Defined(t)) {
          if (absl::Status s = engine.Rematerialize(t); !s.ok()) return s;
        }
        engine.Pin(t);
        break;
      }
      case TraceOpKind::kConstant:
        if (absl::Status s = constant(op); !s.ok()) return s;
        break;
      case TraceOpKind::kCopy: {
        TensorId src;
        if (absl::Status s = lookup(op.args[0], op, src); !s.ok()) return s;
        engine.Retain(src);
        bind(op.results[0].name, src);
        break;
      }
      case TraceOpKind::kCopyFrom: {
        TensorId src, dst;
        if (absl::Status s = lookup(op.args[0], op, src); !s.ok()) return s;
        if (absl::Status s = lookup(op.results[0].name, op, dst); !s.ok()) return s;
        engine.Release(dst);
        engine.Retain(src);
        bind(op.results[0].name, src);
        break;
      }
      case TraceOpKind::kRelease: {
        // As the PyTorch path releases a storage its records hold (EngineBridge::ReleaseIfDead).
        if (bound[op.args[0]] >= 0) {
          engine.Release(static_cast<TensorId>(bound[op.args[0]]), /*keep_if_replays_read=*/drive.product);
        }
        break;
      }
      case TraceOpKind::kCall: {
        if (absl::Status s = gather_inputs(op); !s.ok()) return s;
        outputs.clear();
        absl::StatusOr<std::span<const TensorId>> outs;
        if (drive.product && drive.executor->arena_mode()) {
          outs = call_as_kernel(op);
        } else {
          for (const TraceResult& r : op.results) outputs.push_back({r.alias >= 0 ? 0 : r.bytes, r.alias});
          outs = engine.Call(inputs, outputs, op.time_ns, op.op_name);
        }
        if (!outs.ok()) return outs.status();
        made_storages.clear();
        for (std::size_t i = 0; i < op.results.size(); ++i) {
          bind(op.results[i].name, (*outs)[i]);
          if (op.results[i].alias < 0) {
            defer_in_backward(outs->subspan(i, 1));
            made_storages.push_back(engine.StorageOf((*outs)[i]));
          }
        }
        note_made(op.op_name);
        if (drive.op_log != nullptr) {
          drive.op_log->push_back(outs->empty() ? std::int64_t{-1} : -1 - std::int64_t{engine.ProducerOf((*outs)[0])});
        }
        if (after_op) after_op();
        break;
      }
      case TraceOpKind::kMutate: {
        if (absl::Status s = gather_inputs(op); !s.ok()) return s;
        absl::StatusOr<std::span<const TensorId>> outs = mutate(op);
        if (!outs.ok()) return outs.status();
        const std::vector<TensorId> made(outs->begin(), outs->end());
        made_storages.clear();
        for (TensorId t : made) made_storages.push_back(engine.StorageOf(t));
        note_made(op.op_name);
        for (std::size_t i = 0; i < written.size(); ++i) {
          const TraceName n = op.args[written[i]];
          engine.Release(static_cast<TensorId>(bound[n]));
          bind(n, made[i]);
          if (drive.product) {
            drive.executor->Adopt(engine, engine.StorageOf(made[i]));  // it took over the written bytes
            defer_in_backward(std::span<const TensorId>(&made[i], 1));
          }
        }
        if (drive.op_log != nullptr) {
          drive.op_log->push_back(made.empty() ? std::int64_t{-1} : -1 - std::int64_t{engine.ProducerOf(made[0])});
        }
        if (after_op) after_op();
        break;
      }
    }
  }
  // Names still referenced are the outputs: make them resident and keep them.
  for (TraceName n : order) {
    TensorId t = static_cast<TensorId>(bound[n]);
    if (engine.ExternalRefs(t) <= 0) continue;
    if (!engine.Defined(t)) {
      if (absl::Status s = engine.Rematerialize(t); !s.ok()) return s;
    }
    engine.Pin(t);
  }
  return absl::OkStatus();
}

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Replayer::Replayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Replayer::~Replayer() = default;

absl::StatusOr<std::unique_ptr<Replayer>> Replayer::Create(const Trace& trace) {
  auto impl = std::make_unique<Impl>();
  impl->trace = &trace;
  // Baseline: unlimited budget; a released storage's memory is gone at once (nothing gets evicted otherwise). One
  // per configuration: writing in place (product) needs less memory than copy-on-write (DTR paper).
  for (const EngineConfig config : {EngineConfig::kProduct, EngineConfig::kDtrPaper}) {
    absl::StatusOr<std::unique_ptr<Policy>> policy = MakePolicy("dtr-local");
    if (!policy.ok()) return policy.status();
    EngineOptions options;
    options.policy = policy->get();
    options.free_released_constants = true;
    SimExecutor executor(nullptr, false);
    Engine engine(options, &executor);
    DriveOptions drive;
    drive.product = config == EngineConfig::kProduct;
    drive.executor = &executor;
    if (absl::Status s = Drive(trace, engine, drive); !s.ok()) return s;
    Baseline& baseline = impl->baselines[static_cast<int>(config)];
    baseline.compute_ns = engine.stats().model_compute;
    baseline.memory_bytes = engine.stats().peak_bytes;
  }
  return std::unique_ptr<Replayer>(new Replayer(std::move(impl)));
}

const Baseline& Replayer::baseline(EngineConfig config) const { return impl_->baselines[static_cast<int>(config)]; }

ReplayResult Replayer::Run(const ReplayOptions& options) {
  if (options.policy == kPlanPolicy && options.follow_plan == nullptr && options.record_plan == nullptr) {
    return RunPlanMode(*this, options);
  }
  const std::int64_t start = NowNs();
  const bool product = options.engine == EngineConfig::kProduct;
  const Baseline& baseline = this->baseline(options.engine);
  ReplayResult r;
  r.policy = options.policy;
  r.mode = options.mode;
  r.baseline_compute_ns = baseline.compute_ns;
  r.baseline_memory_bytes = baseline.memory_bytes;
  r.budget_bytes = options.budget_bytes > 0
                       ? options.budget_bytes
                       : static_cast<std::int64_t>(static_cast<double>(baseline.memory_bytes) *
                                                   options.budget_ratio);
  absl::StatusOr<std::unique_ptr<Policy>> policy = MakePolicy(options.policy);
  if (!policy.ok()) return Fail(r, ReplayStatus::kError, std::string(policy.status().message()));

  std::unique_ptr<Arena> arena;
  if (options.mode == AccountingMode::kArena) {
    ArenaOptions ao;
    ao.alignment = static_cast<std::size_t>(options.arena_alignment);
    ao.capacity = static_cast<std::size_t>(std::max<std::int64_t>(r.budget_bytes, 0));
    ao.capacity -= ao.capacity % ao.alignment;
    if (ao.capacity == 0) return Fail(r, ReplayStatus::kOom, "budget is smaller than one arena block");
    if (options.stitch_granule > 0) {
      ao.granule = static_cast<std::size_t>(options.stitch_granule);
      ao.physical_limit = ao.capacity;
      if (ao.physical_limit < ao.granule) return Fail(r, ReplayStatus::kOom, "budget is smaller than one granule");
      ao.capacity *= 2;  // address space to spare, and more segments as needed: only granules are budgeted
      ao.capacity -= ao.capacity % ao.granule;
      ao.grow = true;
    }
    absl::StatusOr<std::unique_ptr<Arena>> a = Arena::Create(MakeVirtualProvider(), ao);
    if (!a.ok()) return Fail(r, ReplayStatus::kError, std::string(a.status().message()));
    arena = std::move(*a);
  }
  EngineOptions eo;
  eo.mode = options.mode;
  eo.budget = r.budget_bytes;
  eo.policy = policy->get();
  eo.choose.sample_sqrt = options.sample_sqrt;
  eo.choose.ignore_small = options.ignore_small;
  eo.seed = options.seed;
  eo.remat_limit = options.overhead_limit > 0
                       ? static_cast<std::int64_t>((options.overhead_limit - 1.0) *
                                                   static_cast<double>(baseline.compute_ns))
                       : -1;
  eo.replay_views = !product;
  eo.free_dead = product;
  eo.free_released_constants = product;
  eo.arena = arena.get();
  eo.compact_first_limit = product ? options.compact_first_limit : 0;
  eo.last_resort_bytes = product ? kProductLastResortBytes : 0;  // small results go last, as on the PyTorch path
  eo.retry_gathering_late = product;
  eo.paging.mode = options.offload;
  eo.paging.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  eo.paging.latency_ns = options.link_latency_ns;
  if (options.host_budget_bytes > 0) eo.paging.host_budget = options.host_budget_bytes;
  eo.paging.page_constants = options.page_constants;
  eo.paging.duplex = options.duplex_link;
  // The PyTorch path partitions only for policies that search windows (engine_bridge.cc BeforeOp).
  // A stitching arena needs no partitioning: windows are not searched there.
  const bool partition = options.cheap_tensor_partitioning && options.stitch_granule == 0 &&
                         (!product || policy->get()->UsesWindows());
  SimExecutor executor(arena.get(), partition);
  Engine engine(eo, &executor);
  if (arena) arena->SetPressureHandler(&engine);
  std::function<void()> sample;
  if (options.timeline != nullptr) {
    options.timeline->clear();
    sample = [&] {
      const EngineStats& st = engine.stats();
      const SimExecutor::Totals& totals = executor.totals();
      options.timeline->push_back({st.clock, st.used_bytes, st.host_used_bytes, totals.evicted_bytes,
                                   totals.released_bytes, totals.rematerialized_bytes, st.rematerializations});
    };
  }
  DriveOptions drive;
  drive.product = product;
  drive.prefetch_ops = options.offload == OffloadMode::kOff ? 0 : options.prefetch_ops;
  drive.prefetch_evicts = options.prefetch_evicts;
  drive.executor = &executor;
  drive.after_op = std::move(sample);
  drive.foresight = options.foresight;
  drive.recorder = options.record_plan;
  std::optional<PlanFollower> follower;
  if (options.follow_plan != nullptr) {
    follower.emplace(options.follow_plan);
    drive.follower = &*follower;
  }
  std::vector<std::int64_t> log;  // replays' op ids and, as -1 - id, each original's
  if (options.schedule != nullptr) {
    executor.set_replay_log(&log);
    drive.op_log = &log;
  }
  absl::Status status = Drive(*impl_->trace, engine, drive);
  if (options.schedule != nullptr) {
    options.schedule->clear();
    absl::flat_hash_map<std::int64_t, std::int32_t> index;  // engine op id -> trace op index
    std::int32_t originals = 0;
    for (std::int64_t entry : log) {
      if (entry < 0) {
        if (entry != -1) index[-1 - entry] = originals;
        options.schedule->push_back(originals++);
      } else {
        auto it = index.find(entry);
        options.schedule->push_back(it != index.end() ? it->second : -1);  // -1: an op the trace did not make
      }
    }
  }
  if (arena) arena->SetPressureHandler(nullptr);

  const EngineStats& st = engine.stats();
  r.total_compute_ns = st.model_compute + st.remat_compute;
  r.replayed_cost_ns = st.remat_compute;
  r.transfer_stall_ns = st.stall_ns;
  r.overhead = baseline.compute_ns > 0
                   ? static_cast<double>(r.total_compute_ns + r.transfer_stall_ns) /
                         static_cast<double>(baseline.compute_ns)
                   : 1.0;
  r.paged_out_bytes = st.paged_out_bytes;
  r.paged_in_bytes = st.paged_in_bytes;
  r.page_outs = st.page_outs;
  r.page_ins = st.page_ins;
  r.prefetches = st.prefetches;
  r.host_peak_bytes = st.host_peak_bytes;
  r.peak_bytes = st.peak_bytes;
  r.evictions = st.evictions;
  r.rematerializations = st.rematerializations;
  r.heuristic_evaluations = st.heuristic_evaluations;
  r.search_time_ns = st.search_ns;
  r.plan_victims = st.plan_victims;
  r.plan_fallbacks = st.plan_fallbacks;
  if (follower && follower->departed()) r.plan_departure = follower->departure();
  r.fragmentation_rate =
      st.fragmentation_samples > 0 ? st.fragmentation_sum / static_cast<double>(st.fragmentation_samples) : 0;
  if (!status.ok()) {
    if (absl::IsResourceExhausted(status)) {
      r.status = ReplayStatus::kOom;
    } else if (absl::IsAborted(status)) {
      r.status = ReplayStatus::kThrash;
    } else {
      r.status = ReplayStatus::kError;
    }
    r.message = std::string(status.message());
  }
  r.wall_time_ns = NowNs() - start;
  return r;
}

ReplayResult Replay(const Trace& trace, const ReplayOptions& options) {
  absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(trace);
  if (!replayer.ok()) {
    ReplayResult r;
    r.status = ReplayStatus::kError;
    r.message = std::string(replayer.status().message());
    r.policy = options.policy;
    r.mode = options.mode;
    return r;
  }
  return (*replayer)->Run(options);
}

}  // namespace remat
