// Replay: runs a parsed Trace through the real engine (runtime/) with a simulated executor, under a memory budget
// and an eviction policy, and reports what happened (the `remat-sim` tool is a front end to this).
//
// Contract:
//   - The simulated executor advances a logical clock by each op's TIME (replays included) and places outputs:
//     counter mode counts bytes against the budget; arena mode places every storage in an Arena over the virtual
//     provider (capacity = budget rounded down to the alignment, owner id = storage index + 1), so fragmentation
//     counts.
//   - The budget is `budget_bytes` when non-zero, otherwise int(budget_ratio x baseline memory).
//   - Baseline = one unconstrained replay (a storage's memory goes when its last reference does, constants
//     included, which is what makes its peak equal simrd's byte for byte): its summed op time is
//     `baseline_compute_ns`, its peak bytes in use (constants included) `baseline_memory_bytes`.
//     A Replayer computes it once per engine configuration (below) and reuses it for every Run; Replay() is the
//     one-shot convenience.
//   - Overhead = op time including replays (the clock's advance) / baseline compute. Status kThrash when the
//     replayed time (plus transfer stall when paging) exceeds (overhead_limit - 1) x baseline compute
//     (overhead_limit <= 0 disables the check); kOom when an op cannot get
//     memory (message says how much was requested, locked, constant, and the largest window); kError for a trace
//     the engine rejects (message says why). Overhead, peak and counters are still filled in up to the failure.
//   - The engine configuration (`engine`). kProduct (the default) is what the PyTorch path runs
//     (integration/engine_bridge.h): a storage nothing can need any more is freed for good (EngineOptions::
//     free_dead) and a released constant's memory goes; views come back with their storage (no view-op replay); a
//     MUTATE writes its arguments in place (OutputSpec::in_place_of: a constant written in place stays a constant,
//     the old value of anything else stays recomputable); the outputs of ops in a backward pass (after `ANNOTATE
//     BACKWARD`, up to `ANNOTATE FORWARD`) are deferred (Engine::Defer); a PIN line pins its name (made resident
//     first). kDtrPaper reproduces the DTR prototype's simulator (simrd) exactly, as parity needs (README "What
//     simrd does exactly"): a released storage is evicted but kept for neighbourhood costs even when nothing can
//     need it any more, an evicted view is brought back by replaying its view op, a MUTATE makes fresh copies of its
//     arguments, constants stay resident once released, and BACKWARD, FORWARD and PIN change nothing.
//   - Paging (`offload` != off; EngineOptions::paging and the engine's contract): a link of `bandwidth_bytes_per_s`
//     (default 12e9, the V100 <-> pinned host figure of Beaumont et al.) with `link_latency_ns` per copy (default
//     10 us: a cudaMemcpyAsync launch plus event synchronisation costs a few us; 10 us is on the cautious side),
//     a second tier of `host_budget_bytes` (0 = unlimited). Prefetch: before each op, the paged inputs of the next
//     `prefetch_ops` ops of the trace (the future is known in a replay) are paged in, soonest first, while they fit
//     in free memory (with `prefetch_evicts`, while room can be made as for an op, the window's own inputs held).
//     With offload on, overhead = (op time including replays + transfer stall) / baseline compute; with offload
//     off, nothing changes (stall is 0 and results are those of the engine without paging).
//   - Runs are independent and deterministic (random policy: seeded by `seed`). A Replayer is not thread-safe;
//     use one per thread (the Trace may be shared).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/config.h"
#include "runtime/engine.h"
#include "runtime/plan_guide.h"
#include "runtime/trace.h"

namespace remat {

enum class ReplayStatus { kPass, kOom, kThrash, kError };

// Which engine configuration a replay runs (see the contract above).
enum class EngineConfig { kProduct, kDtrPaper };

std::string_view ToString(ReplayStatus status);   // "pass", "oom", "thrash", "error"
std::string_view ToString(AccountingMode mode);   // "counter", "arena"
absl::StatusOr<AccountingMode> ParseAccountingMode(std::string_view text);

// The state after one op of a replay, for remat-sim --timeline.
struct TimelineSample {
  std::int64_t clock_ns = 0;            // the simulated clock (op time, replays included)
  std::int64_t used_bytes = 0;          // in use on the device: the engine's count (arena: allocated blocks)
  std::int64_t paged_out_bytes = 0;     // in the second tier
  std::int64_t evicted_bytes = 0;       // so far: evicted while the trace still referred to them
  std::int64_t released_bytes = 0;      // so far: freed when their last reference went (still recomputable)
  std::int64_t rematerialized_bytes = 0;  // so far: delivered again by replays
  std::int64_t rematerializations = 0;  // so far: ops replayed
};

struct ReplayOptions {
  std::string policy = "dtr-eq";       // a registered policy name (policies/registry.h: PolicyNames())
  double budget_ratio = 1.0;           // of baseline memory; used when budget_bytes == 0
  std::int64_t budget_bytes = 0;       // absolute budget; wins over budget_ratio when non-zero
  AccountingMode mode = AccountingMode::kCounter;
  double overhead_limit = 2.0;         // thrash limit; <= 0 disables it
  bool sample_sqrt = false;            // score only sqrt(n) random candidates per eviction
  bool ignore_small = false;           // skip candidates smaller than 1% of the mean candidate size
  std::uint64_t seed = 0;              // random policy and sampling
  EngineConfig engine = EngineConfig::kProduct;  // see the contract above
  bool cheap_tensor_partitioning = true;  // arena mode: costly ops' outputs low, others high
  std::int64_t arena_alignment = 512;  // arena mode only
  // Arena mode: EngineOptions::compact_first_limit (times the request; 0 evicts first). The DTR paper's
  // configuration always evicts first.
  std::size_t compact_first_limit = EngineOptions{}.compact_first_limit;
  // Arena mode: a stitching arena with granules of this many bytes (issue 18; ArenaOptions::granule): the budget
  // counts mapped granules, address space is not limited, and window policies rank by cost alone. 0: no stitching.
  std::int64_t stitch_granule = 0;
  // Paging (see the contract above).
  OffloadMode offload = OffloadMode::kOff;
  double bandwidth_bytes_per_s = 12e9;
  std::int64_t link_latency_ns = 10'000;
  std::int64_t host_budget_bytes = 0;  // 0 = unlimited
  bool page_constants = false;
  int prefetch_ops = 8;                // lookahead window in ops; 0 disables prefetch
  bool prefetch_evicts = false;        // a prefetch may make room (through the policy) instead of using free memory
  bool duplex_link = false;            // page-ins do not queue behind page-outs (PagingOptions::duplex)
  // When set, cleared and filled with one sample after each CALL and MUTATE of the trace (not owned).
  std::vector<TimelineSample>* timeline = nullptr;
  // When set (not owned), cleared and filled with the run's schedule: every execution in order, as the index of its
  // CALL or MUTATE in the trace (0-based): each op at its place, and each replay where it ran (tools/schedule_check.h
  // checks such a schedule offline).
  std::vector<std::int32_t>* schedule = nullptr;
  // The DTR family ranks by the ops until each candidate's next read in this trace instead of the time since its
  // last access (runtime/trace_future.h): how much a recorded iteration's foresight could give (issue 21).
  bool foresight = false;
  // Plan mode (runtime/plan_guide.h): when set (not owned), the recorder learns the run after each CALL and
  // MUTATE; when set, the run follows the plan (Engine::SetPlan) with `policy` as the online fallback, and leaves it
  // for the policy alone where the trace departs from it (ReplayResult::plan_departure).
  PlanRecorder* record_plan = nullptr;
  std::shared_ptr<const IterationPlan> follow_plan;
};

struct ReplayResult {
  ReplayStatus status = ReplayStatus::kPass;
  std::string message;                 // empty on pass; the reason otherwise
  std::string policy;
  AccountingMode mode = AccountingMode::kCounter;
  double overhead = 0;                 // clock / baseline compute
  std::int64_t budget_bytes = 0;
  std::int64_t peak_bytes = 0;         // peak bytes in use (counter) or allocated in the arena (arena)
  std::int64_t baseline_compute_ns = 0;
  std::int64_t baseline_memory_bytes = 0;
  std::int64_t total_compute_ns = 0;   // the clock at the end: op time including replays
  std::int64_t replayed_cost_ns = 0;   // op time spent in rematerializations only
  std::int64_t evictions = 0;
  std::int64_t rematerializations = 0; // ops replayed
  std::int64_t heuristic_evaluations = 0;
  std::int64_t search_time_ns = 0;     // wall time spent choosing victims (policy + window search)
  double fragmentation_rate = 0;       // arena mode: mean free bytes / budget at allocations that evicted
  std::int64_t wall_time_ns = 0;       // wall time of this run (baseline excluded)
  // Paging.
  std::int64_t paged_out_bytes = 0;
  std::int64_t paged_in_bytes = 0;
  std::int64_t page_outs = 0;
  std::int64_t page_ins = 0;           // prefetches included
  std::int64_t prefetches = 0;
  std::int64_t transfer_stall_ns = 0;  // clock time ops waited for page-ins (in the overhead)
  std::int64_t host_peak_bytes = 0;
  // Plan mode (follow_plan): victims the plan named, the policy's choices where it held all resident, and why the
  // run left the plan (empty if it did not).
  std::int64_t plan_victims = 0;
  std::int64_t plan_fallbacks = 0;
  std::string plan_departure;
  std::string plan_source;  // policy "plan": the schedule followed (runtime/plan_mode.h)
};

struct Baseline {
  std::int64_t compute_ns = 0;
  std::int64_t memory_bytes = 0;       // peak, constants included
};

// Prepares a trace once (name resolution, op graph) and replays it under many options cheaply.
class Replayer {
 public:
  // Fails (InvalidArgument, naming the trace line) when the trace cannot be replayed even unconstrained,
  // e.g. an ARGS name that was released and never rebound.
  static absl::StatusOr<std::unique_ptr<Replayer>> Create(const Trace& trace);
  ~Replayer();
  Replayer(const Replayer&) = delete;
  Replayer& operator=(const Replayer&) = delete;

  const Baseline& baseline(EngineConfig config = EngineConfig::kProduct) const;
  // Policy "plan" (policies/registry.h kPlanPolicy) runs plan mode (runtime/plan_mode.h RunPlanMode).
  ReplayResult Run(const ReplayOptions& options);

 private:
  struct Impl;
  explicit Replayer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One-shot: prepares the trace, computes the baseline and runs once. A trace the engine rejects gives kError.
ReplayResult Replay(const Trace& trace, const ReplayOptions& options);

}  // namespace remat
