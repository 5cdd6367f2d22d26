#include "tools/sim_runner.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/trace_segment.h"

namespace remat::sim {
namespace {

// Runs fn(i) for i in [0, count) on `threads` threads (the calling thread is one of them).
void ParallelFor(std::size_t count, int threads, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::jthread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(work);
  work();
}

}  // namespace

int ThreadCount(int requested, std::size_t jobs) {
  int threads = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(threads, 1);
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(threads), std::max<std::size_t>(jobs, 1)));
}

std::vector<SimJob> PlanJobs(const SimOptions& options) {
  std::vector<SimJob> jobs;
  for (std::size_t t = 0; t < options.traces.size(); ++t) {
    for (const std::string& policy : options.policies) {
      for (const std::string& offload : options.offload) {
        for (double ratio : options.ratios) jobs.push_back(SimJob{t, policy, offload, ratio, 0});
        for (std::uint64_t budget : options.budgets) jobs.push_back(SimJob{t, policy, offload, 0, budget});
      }
    }
  }
  return jobs;
}

ReplayOptions MakeReplayOptions(const SimOptions& options, AccountingMode mode, const SimJob& job) {
  ReplayOptions replay;
  replay.policy = job.policy;
  replay.budget_ratio = job.budget_bytes == 0 ? job.ratio : 1.0;
  replay.budget_bytes = static_cast<std::int64_t>(job.budget_bytes);
  replay.mode = mode;
  replay.overhead_limit = options.overhead_limit;
  replay.sample_sqrt = options.sample_sqrt;
  replay.ignore_small = options.ignore_small;
  replay.seed = options.seed;
  replay.engine = options.dtr_paper ? EngineConfig::kDtrPaper : EngineConfig::kProduct;
  replay.cheap_tensor_partitioning = options.cheap_tensor_partitioning;
  replay.compact_first_limit = options.compact_first_limit;
  if (options.mode == kStitchMode) replay.stitch_granule = static_cast<std::int64_t>(options.granule_bytes);
  // The names were validated by ParseSimOptions; an unknown one cannot get here.
  replay.offload = ParseOffloadMode(job.offload).value_or(OffloadMode::kOff);
  replay.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  if (options.link_latency_ns >= 0) replay.link_latency_ns = options.link_latency_ns;
  replay.host_budget_bytes = static_cast<std::int64_t>(options.host_budget_bytes);
  replay.page_constants = options.page_constants;
  replay.duplex_link = options.duplex_link;
  replay.foresight = options.foresight;
  return replay;
}

SimRow MakeRow(const std::string& trace_path, AccountingMode mode, const SimJob& job, const ReplayResult& result,
               std::string_view mode_name) {
  SimRow row;
  row.trace = TraceFileName(trace_path);
  row.policy = job.policy;
  row.mode = mode_name.empty() ? std::string(ToString(mode)) : std::string(mode_name);
  row.offload = job.offload;
  row.budget_given = job.budget_bytes != 0;
  if (!row.budget_given) {
    row.ratio = job.ratio;
  } else if (result.baseline_memory_bytes > 0) {
    row.ratio = static_cast<double>(job.budget_bytes) / static_cast<double>(result.baseline_memory_bytes);
  }
  row.budget_bytes = result.budget_bytes;
  row.result = std::string(ToString(result.status));
  row.overhead = result.overhead;
  row.peak_bytes = result.peak_bytes;
  row.replayed_cost_ns = result.replayed_cost_ns;
  row.evictions = result.evictions;
  row.rematerializations = result.rematerializations;
  row.heuristic_evaluations = result.heuristic_evaluations;
  row.search_time_ns = result.search_time_ns;
  row.fragmentation_rate = result.fragmentation_rate;
  row.wall_time_ns = result.wall_time_ns;
  row.baseline_compute_ns = result.baseline_compute_ns;
  row.baseline_memory_bytes = result.baseline_memory_bytes;
  row.total_compute_ns = result.total_compute_ns;
  row.paged_out_bytes = result.paged_out_bytes;
  row.paged_in_bytes = result.paged_in_bytes;
  row.page_outs = result.page_outs;
  row.page_ins = result.page_ins;
  row.transfer_stall_ns = result.transfer_stall_ns;
  row.message = result.message;
  if (!result.plan_source.empty() && result.message.empty()) {  // plan mode: which schedule it followed
    row.message = absl::StrCat("followed ", result.plan_source, " (", result.plan_victims, " planned victims, ",
                               result.plan_fallbacks, " fallbacks)",
                               result.plan_departure.empty() ? "" : "; departed: ", result.plan_departure);
  }
  return row;
}

struct SimRunner::State {
  SimOptions options;
  AccountingMode mode = AccountingMode::kCounter;
  std::vector<Trace> traces;
  std::vector<Baseline> baselines;
  // Idle replayers per trace; a worker pops one (or makes one) and pushes it back when its job is done.
  std::mutex pool_mutex;
  std::vector<std::vector<std::unique_ptr<Replayer>>> idle;

  absl::StatusOr<std::unique_ptr<Replayer>> Acquire(std::size_t trace) {
    {
      std::lock_guard lock(pool_mutex);
      if (!idle[trace].empty()) {
        std::unique_ptr<Replayer> replayer = std::move(idle[trace].back());
        idle[trace].pop_back();
        return replayer;
      }
    }
    return Replayer::Create(traces[trace]);
  }

  void Release(std::size_t trace, std::unique_ptr<Replayer> replayer) {
    std::lock_guard lock(pool_mutex);
    idle[trace].push_back(std::move(replayer));
  }
};

SimRunner::SimRunner(std::unique_ptr<State> state) : state_(std::move(state)) {}
SimRunner::~SimRunner() = default;

absl::StatusOr<std::unique_ptr<SimRunner>> SimRunner::Prepare(const SimOptions& options) {
  auto state = std::make_unique<State>();
  state->options = options;
  // Stitch mode is arena mode over a stitching arena (ReplayOptions::stitch_granule).
  absl::StatusOr<AccountingMode> mode =
      ParseAccountingMode(options.mode == kStitchMode ? ToString(AccountingMode::kArena) : options.mode);
  if (!mode.ok()) return mode.status();
  state->mode = *mode;

  const std::size_t count = options.traces.size();
  state->traces.resize(count);
  state->baselines.resize(count);
  state->idle.resize(count);
  std::vector<absl::Status> errors(count);
  ParallelFor(count, ThreadCount(options.jobs, count), [&](std::size_t t) {
    absl::StatusOr<Trace> trace = ReadTrace(options.traces[t]);
    if (!trace.ok()) {
      errors[t] = trace.status();
      return;
    }
    if (options.segment_first >= 0) {
      trace = SegmentTrace(*trace, options.segment_first, options.segment_count);
      if (!trace.ok()) {
        errors[t] = trace.status();
        return;
      }
    }
    state->traces[t] = *std::move(trace);
    absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(state->traces[t]);
    if (!replayer.ok()) {
      errors[t] = replayer.status();
      return;
    }
    state->baselines[t] =
        (*replayer)->baseline(options.dtr_paper ? EngineConfig::kDtrPaper : EngineConfig::kProduct);
    state->idle[t].push_back(*std::move(replayer));
  });
  for (const absl::Status& error : errors) {
    if (!error.ok()) return error;
  }
  return std::unique_ptr<SimRunner>(new SimRunner(std::move(state)));
}

const Baseline& SimRunner::baseline(std::size_t trace) const { return state_->baselines[trace]; }

const Trace& SimRunner::trace(std::size_t trace) const { return state_->traces[trace]; }

std::vector<SimRow> SimRunner::Run(const std::vector<SimJob>& jobs, int threads, const OnDone& on_done,
                                   std::vector<TimelineSample>* timeline) {
  if (timeline != nullptr && jobs.size() != 1) {
    std::vector<SimRow> rows;
    for (const SimJob& job : jobs) {
      ReplayResult result;
      result.status = ReplayStatus::kError;
      result.mode = state_->mode;
      result.message = "a timeline is of one run";
      rows.push_back(MakeRow(state_->options.traces[job.trace], state_->mode, job, result, state_->options.mode));
    }
    return rows;
  }
  std::vector<SimRow> rows(jobs.size());
  std::mutex done_mutex;
  std::size_t done = 0;
  ParallelFor(jobs.size(), ThreadCount(threads, jobs.size()), [&](std::size_t i) {
    const SimJob& job = jobs[i];
    const std::string& path = state_->traces[job.trace].path;  // with "@first+count" for a segment
    ReplayResult result;
    absl::StatusOr<std::unique_ptr<Replayer>> replayer = state_->Acquire(job.trace);
    if (replayer.ok()) {
      ReplayOptions replay_options = MakeReplayOptions(state_->options, state_->mode, job);
      replay_options.timeline = timeline;
      result = (*replayer)->Run(replay_options);
      state_->Release(job.trace, *std::move(replayer));
    } else {
      // Prepare already created a replayer for this trace, so this is unexpected; report it in the row.
      result.status = ReplayStatus::kError;
      result.mode = state_->mode;
      result.message = std::string(replayer.status().message());
    }
    rows[i] = MakeRow(path, state_->mode, job, result, state_->options.mode);
    std::lock_guard lock(done_mutex);
    ++done;
    if (on_done) on_done(rows[i], done, jobs.size());
  });
  return rows;
}

}  // namespace remat::sim
