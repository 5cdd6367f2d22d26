// Plan mode's planner: see plan_mode.h.
#include "runtime/plan_mode.h"

#include <chrono>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "policies/registry.h"

namespace remat {

std::vector<PlanCandidate> PlanCandidates() {
  std::vector<PlanCandidate> out;
  for (const char* policy : {"dtr-eq", "dtr", "dtr-local", "msps", "lru", "largest", "dte"}) {
    out.push_back({policy, false});
  }
  for (const char* policy : {"dtr-eq", "dtr", "dtr-local"}) out.push_back({policy, true});
  return out;
}

absl::StatusOr<IterationPlan> PlanIteration(Replayer& replayer, const ReplayOptions& base,
                                            const std::vector<PlanCandidate>& candidates) {
  std::optional<IterationPlan> best;
  std::int64_t best_fallbacks = 0;
  std::string failures;
  for (const PlanCandidate& candidate : candidates) {
    ReplayOptions record = base;
    record.policy = candidate.policy;
    record.foresight = candidate.foresight;
    record.timeline = nullptr;
    record.schedule = nullptr;
    record.follow_plan = nullptr;
    PlanRecorder recorder;
    record.record_plan = &recorder;
    const ReplayResult recorded = replayer.Run(record);
    if (recorded.status != ReplayStatus::kPass) {
      if (failures.empty()) failures = absl::StrCat(candidate.Name(), ": ", recorded.message);
      continue;
    }
    auto plan = std::make_shared<IterationPlan>(recorder.Finish(candidate.Name(), recorded.overhead,
                                                                recorded.budget_bytes));
    ReplayOptions follow = base;
    follow.record_plan = nullptr;
    follow.timeline = nullptr;
    follow.schedule = nullptr;
    follow.follow_plan = plan;
    const ReplayResult followed = replayer.Run(follow);
    if (followed.status != ReplayStatus::kPass) {
      if (failures.empty()) failures = absl::StrCat(candidate.Name(), " followed: ", followed.message);
      continue;
    }
    if (!best || followed.overhead < best->overhead ||
        (followed.overhead == best->overhead && followed.plan_fallbacks < best_fallbacks)) {
      plan->overhead = followed.overhead;
      best = std::move(*plan);
      best_fallbacks = followed.plan_fallbacks;
    }
  }
  if (!best) {
    return absl::NotFoundError(absl::StrCat("no schedule fits the budget of ", base.budget_bytes,
                                            " bytes (", failures, ")"));
  }
  return *std::move(best);
}

ReplayResult RunPlanMode(Replayer& replayer, const ReplayOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ReplayOptions base = options;
  base.policy = "dtr-eq";
  if (base.budget_bytes == 0) {
    base.budget_bytes = static_cast<std::int64_t>(static_cast<double>(replayer.baseline(options.engine).memory_bytes) *
                                                  options.budget_ratio);
  }
  absl::StatusOr<IterationPlan> plan = PlanIteration(replayer, base);
  ReplayOptions follow = base;
  if (plan.ok()) follow.follow_plan = std::make_shared<const IterationPlan>(*std::move(plan));
  ReplayResult r = replayer.Run(follow);
  r.policy = std::string(kPlanPolicy);
  r.plan_source = follow.follow_plan != nullptr ? follow.follow_plan->source
                                                : absl::StrCat("none (", plan.status().message(), ")");
  r.wall_time_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace remat
