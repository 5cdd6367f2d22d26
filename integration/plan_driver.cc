// Plan driver: see plan_driver.h.
#include "integration/plan_driver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/plan_mode.h"
#include "runtime/trace.h"

namespace remat::integration {

PlanDriver::PlanDriver(ReplayOptions base, bool estimated_costs, TraceRecorder::CountsAgainstBudget counts)
    : base_(std::move(base)),
      estimated_costs_(estimated_costs),
      counts_(std::move(counts)),
      recorder_(TraceRecorder::InMemory(estimated_costs, counts_)) {
  SetPinListener(this, PinListenerSlot::kPlan);
}

PlanDriver::~PlanDriver() {
  SetPinListener(nullptr, PinListenerSlot::kPlan);
  if (planner_.joinable()) planner_.join();  // a child left the parent's behind (AfterForkInChild)
}

void PlanDriver::Record(const OpRecord& record) {
  if (!off_) recorder_->OnOp(record);
}

void PlanDriver::Pinned(const c10::StorageImpl* storage) { recorder_->OnPinned(storage); }

void PlanDriver::BlankOverwritten(const c10::StorageImpl* storage) { recorder_->OnBlankOverwritten(storage); }

void PlanDriver::AfterEngineOp(Engine& engine, std::string_view name, std::span<const StorageIndex> made,
                               std::int64_t made_bytes) {
  if (off_ || !follower_ || follower_->departed()) return;
  if (!follower_->OnOp(name, made, made_bytes)) Depart(engine, follower_->departure());
}

void PlanDriver::Depart(Engine& engine, std::string reason) {
  engine.SetPlan(nullptr);
  ++stats_.departures;
  stats_.last_departure = std::move(reason);
  stats_.following = false;
}

void PlanDriver::AfterForkInChild(Engine& engine) {
  off_ = true;
  engine.SetPlan(nullptr);
  follower_.reset();
  stats_.following = false;
  new std::thread(std::move(planner_));  // leaked: a parent's thread, never joined here
  new (&mutex_) std::mutex();            // another thread may have held it at the fork
}

void PlanDriver::EndIteration(Engine& engine, std::span<c10::StorageImpl* const> live) {
  if (off_) return;
  ++stats_.iterations;
  std::string text = recorder_->TakeText();
  recorder_ = TraceRecorder::InMemory(estimated_costs_, counts_);
  for (c10::StorageImpl* storage : live) recorder_->Declare(*storage);
  if (follower_) {
    const bool whole = !follower_->departed() && follower_->finished();
    if (!follower_->departed() && !whole) {
      Depart(engine, absl::StrCat("the iteration ended after ", follower_->position(), " of the plan's ",
                                  follower_->plan().ops.size(), " ops"));
    }
    if (whole) {
      ++stats_.followed_iterations;
      follower_.emplace(plan_);  // the next iteration follows from its start
      engine.SetPlan(&*follower_);
      return;
    }
    follower_.reset();
    plan_.reset();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (planner_done_) {
      planner_done_ = false;
      if (planned_ != nullptr) {
        plan_ = std::move(planned_);
        ++stats_.plans_made;
        stats_.source = plan_->source;
        stats_.planned_overhead = plan_->overhead;
      } else {
        ++stats_.planning_failures;
        stats_.last_failure = planner_error_;
      }
      stats_.planning = false;
    }
  }
  if (plan_ != nullptr) {
    follower_.emplace(plan_);
    engine.SetPlan(&*follower_);
    stats_.following = true;
    return;
  }
  // The first iteration is the odd one of most loops (optimizer state made, lazy modules built): the next one is
  // what later iterations repeat.
  if (!stats_.planning && stats_.iterations > 1) StartPlanning(std::move(text));
}

void PlanDriver::StartPlanning(std::string trace_text) {
  if (planner_.joinable()) planner_.join();  // finished: its result was taken above
  stats_.planning = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    planned_trace_ = trace_text;
  }
  planner_ = std::thread([this, text = std::move(trace_text)]() {
    std::shared_ptr<const IterationPlan> plan;
    std::string error;
    absl::StatusOr<Trace> trace = ParseTrace(text, "<recorded iteration>");
    if (!trace.ok()) {
      error = std::string(trace.status().message());
    } else {
      absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(*trace);
      if (!replayer.ok()) {
        error = std::string(replayer.status().message());
      } else {
        absl::StatusOr<IterationPlan> made = PlanIteration(**replayer, base_);
        if (made.ok()) {
          plan = std::make_shared<const IterationPlan>(*std::move(made));
        } else {
          error = std::string(made.status().message());
        }
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    planned_ = std::move(plan);
    planner_error_ = std::move(error);
    planner_done_ = true;
  });
}

std::string PlanDriver::PlannedTrace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_trace_;
}

PlanDriverStats PlanDriver::Stats() const { return stats_; }

}  // namespace remat::integration
