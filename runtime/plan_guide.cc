// Plan guide: see plan_guide.h.
#include "runtime/plan_guide.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace remat {

std::int64_t IterationPlan::OutUntil(std::uint32_t value, std::int64_t position) const {
  if (value >= out.size()) return -1;
  const std::vector<OutInterval>& intervals = out[value];
  // The last interval starting at or before `position`.
  auto it = std::upper_bound(intervals.begin(), intervals.end(), position,
                             [](std::int64_t p, const OutInterval& i) { return p < i.from; });
  if (it == intervals.begin()) return -1;
  --it;
  return position < it->until ? it->until : -1;
}

void PlanRecorder::OnOp(const Engine& engine, std::string_view name, std::span<const StorageIndex> made) {
  if (made.empty()) return;  // not a position (see the contract)
  const std::int64_t position = static_cast<std::int64_t>(plan_.ops.size());
  std::int64_t bytes = 0;
  for (StorageIndex s : made) bytes += engine.StorageBytes(s);
  plan_.ops.push_back({std::string(name), static_cast<std::uint32_t>(made.size()),
                       static_cast<std::uint32_t>(plan_.out.size()), bytes});
  for (StorageIndex s : made) {
    const std::uint32_t v = static_cast<std::uint32_t>(plan_.out.size());
    plan_.out.emplace_back();
    storage_of_.push_back(s);
    out_now_.push_back(false);
    value_of_[s] = v;  // a reused slot: the value it named is retired below
    live_.push_back(v);
  }
  for (std::size_t i = 0; i < live_.size();) {
    const std::uint32_t v = live_[i];
    const StorageIndex s = storage_of_[v];
    auto named = value_of_.find(s);
    const bool retired = named == value_of_.end() || named->second != v || engine.Dead(s);
    const bool out = retired || !engine.Resident(s);
    if (out && !out_now_[v]) plan_.out[v].push_back({position, EvictionPlan::kNeverBack});
    if (!out && out_now_[v]) plan_.out[v].back().until = position;
    out_now_[v] = out;
    if (retired) {
      if (named != value_of_.end() && named->second == v) value_of_.erase(named);
      live_[i] = live_.back();
      live_.pop_back();
      continue;
    }
    ++i;
  }
}

IterationPlan PlanRecorder::Finish(std::string source, double overhead, std::int64_t budget) {
  IterationPlan plan = std::move(plan_);
  plan.source = std::move(source);
  plan.overhead = overhead;
  plan.budget = budget;
  *this = PlanRecorder();
  return plan;
}

bool PlanFollower::OnOp(std::string_view name, std::span<const StorageIndex> made, std::int64_t bytes) {
  if (departed()) return false;
  if (made.empty()) return true;  // not a position
  if (position_ >= static_cast<std::int64_t>(plan_->ops.size())) {
    departure_ = absl::StrCat("op '", std::string(name), "' runs after the planned iteration's ", plan_->ops.size(), " ops");
    return false;
  }
  const IterationPlan::PlannedOp& planned = plan_->ops[position_];
  if (planned.name != name || planned.made != made.size() || planned.made_bytes != bytes) {
    departure_ = absl::StrCat("op ", position_, " of the iteration is '", std::string(name), "' making ", made.size(),
                              " storage(s) of ", bytes, " bytes; the plan has '", planned.name, "' making ",
                              planned.made, " of ", planned.made_bytes);
    value_of_.clear();
    return false;
  }
  for (std::size_t i = 0; i < made.size(); ++i) value_of_[made[i]] = planned.first_value + static_cast<std::uint32_t>(i);
  ++position_;
  return true;
}

std::int64_t PlanFollower::OutUntil(StorageIndex s) const {
  if (departed()) return -1;
  auto it = value_of_.find(s);
  if (it == value_of_.end()) return -1;
  return plan_->OutUntil(it->second, position_);
}

}  // namespace remat
