// Plan driver: plan mode on the PyTorch path (policy "plan"; issue 21, DESIGN.md "Plan mode"). The engine bridge
// owns one when the policy is plan mode and calls it under the bridge's lock.
//
// Per iteration (an iteration ends at remat.mark_step(), which the Python package calls after every optimizer step):
//   - Recording: every op of the iteration is written to an in-memory trace (trace_recorder.h, the format
//     remat-sim replays), pins included. What exists when the iteration starts (parameters, optimizer state, the
//     batch) is a constant of that trace, of 0 bytes when it lies outside the memory the budget counts.
//   - Positions count the ops that make storages (runtime/plan_guide.h): an op that makes none (loss.item(), a
//     view) may come and go between iterations without leaving the plan.
//   - Planning: at the end of an iteration with no plan in force (not the first: it makes the optimizer's state and
//     whatever else is built lazily, so the second is the one later iterations repeat), a planner thread parses that trace and runs
//     runtime/plan_mode.h's PlanIteration at the bridge's budget, accounting (placement in an arena of the
//     bridge's kind, 64-byte blocks: contiguous, or stitching with its granule) and paging: the cheapest followed schedule among the candidates. Training goes on with the online policy (dtr-eq)
//     meanwhile; nothing waits for the planner.
//   - Following: at the first iteration end after the plan is ready, it is put in force (Engine::SetPlan through a
//     PlanFollower, runtime/plan_guide.h) from the next iteration on; each op the engine runs advances the follower.
//   - Departing: an op that is not the plan's at its position (another op, another number of storages made: a new
//     input shape, data-dependent control flow, a different step) takes the plan out of force at once (the online
//     policy chooses from then on); at that iteration's end it is planned again from what was just recorded. An
//     iteration that ends before the plan's end departs too (it is not the planned iteration).
//   - Choices only: whether a victim is the plan's or the policy's changes which storages are evicted, never a
//     result (the engine's replays are byte-identical either way).
// Stats() counts plans made, iterations followed to their end, departures (with the last reason) and the state.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "integration/dispatch_hook.h"
#include "integration/pin_listener.h"
#include "integration/trace_recorder.h"
#include "runtime/engine.h"
#include "runtime/plan_guide.h"
#include "runtime/replay.h"

namespace remat::integration {

struct PlanDriverStats {
  std::int64_t iterations = 0;       // mark_step calls
  std::int64_t plans_made = 0;       // plans the planner thread finished
  std::int64_t planning_failures = 0;  // recorded iterations no candidate schedule fitted
  std::int64_t followed_iterations = 0;  // iterations that ran under a plan from start to end
  std::int64_t departures = 0;
  bool following = false;            // a plan is in force now
  bool planning = false;             // the planner thread is working
  std::string source;                // the schedule in force (or last in force)
  double planned_overhead = 0;       // its overhead on the recorded iteration (remat-sim's figure)
  std::string last_departure;        // why the last plan left force
  std::string last_failure;          // why the last planning found no schedule
};

class PlanDriver final : public PinListener {
 public:
  // `base`: the replay options the plan is made for (budget_bytes, mode, arena_alignment, paging); its policy is the
  // online fallback. `estimated_costs`: the trace's TIME is the engine's estimate (op_cost.h), as the bridge's costs.
  // `counts`: whether a storage's bytes count against the budget (TraceRecorder::InMemory).
  PlanDriver(ReplayOptions base, bool estimated_costs, TraceRecorder::CountsAgainstBudget counts);
  ~PlanDriver() override;  // waits for the planner thread
  PlanDriver(const PlanDriver&) = delete;
  PlanDriver& operator=(const PlanDriver&) = delete;

  // Every op the hook saw, after it ran (the recording).
  void Record(const OpRecord& record);
  // Every op the engine ran as an original (EndOp), with the storages it made in EndOp's order of fresh and in-place
  // outputs and their bytes as the recording counts them (0 outside the budgeted memory).
  void AfterEngineOp(Engine& engine, std::string_view name, std::span<const StorageIndex> made,
                     std::int64_t made_bytes);
  // The iteration ended (see the contract). `live`: the storages that hold budgeted memory now; the next
  // iteration's recording starts with them (TraceRecorder::Declare), so that its replay counts what the program
  // keeps without touching it (last step's gradients until zero_grad).
  void EndIteration(Engine& engine, std::span<c10::StorageImpl* const> live);
  PlanDriverStats Stats() const;
  // In a forked child (before anything else runs there): the planner thread is not the child's and its lock may have
  // been held at the fork, so both are left behind, and plan mode is off in the child (its online policy chooses).
  void AfterForkInChild(Engine& engine);
  // The recorded iteration the last planning started from (a trace remat-sim replays; empty before).
  std::string PlannedTrace() const;

  void Pinned(const c10::StorageImpl* storage) override;
  void BlankOverwritten(const c10::StorageImpl* storage) override;

 private:
  void StartPlanning(std::string trace_text);
  void Depart(Engine& engine, std::string reason);

  const ReplayOptions base_;
  const bool estimated_costs_;
  const TraceRecorder::CountsAgainstBudget counts_;
  std::unique_ptr<TraceRecorder> recorder_;
  std::shared_ptr<const IterationPlan> plan_;  // in force (or ready to be) while set
  std::optional<PlanFollower> follower_;
  PlanDriverStats stats_;

  // The planner thread's result, guarded by mutex_.
  mutable std::mutex mutex_;
  std::thread planner_;
  bool planner_done_ = false;
  std::shared_ptr<const IterationPlan> planned_;
  std::string planner_error_;
  std::string planned_trace_;  // the planner's input
  bool off_ = false;           // AfterForkInChild
};

}  // namespace remat::integration
