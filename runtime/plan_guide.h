// Plan guide: plan mode's memory of one iteration (issue 21, DESIGN.md "Plan mode"). A training loop repeats its op
// stream; a run of one iteration under a budget (the best of several schedules tried on the recorded iteration) is
// kept as an IterationPlan, and later iterations follow it: under pressure the engine evicts what the plan held out
// of memory at that point (Engine::SetPlan), so the schedule found offline is the one the run makes, whatever the
// measured costs of the moment say.
//
// Contract:
//   - Positions. An iteration is a sequence of original ops that make storages (an op's first execution; replays
//     are not ops here, nor are ops that make no storage: loss.item() or a view may come and go between iterations
//     without changing what the plan says), numbered from 0. "Position p" is the state after p ops of the iteration have run, so while op p runs (its
//     inputs brought back, its outputs allocated) the position is p. A value is one storage an op makes (a fresh
//     output, or the new value of an in-place write), named by (op, ordinal among the storages that op made).
//   - PlanRecorder watches a run (a replay of the recorded iteration) and, after each op, which values made so far
//     are resident; IterationPlan keeps, per value, the positions at which the run held it out of memory (evicted,
//     paged or freed) as intervals [from, until): out after op p ran for every p in the interval, back in memory
//     after op `until` ran (kNeverBack: never again).
//   - PlanFollower (an EvictionPlan) follows the plan in a later run: OnOp after each original op with its name
//     and the storages it made, in the same order as the recorded run gave them. An op whose name, count of made
//     storages or their summed bytes (a new input shape) differ from the plan's at that position, or an op past the plan's end, departs: from then on the
//     follower holds nothing out (the engine's policy chooses alone) and `departed()` says why, so that the caller
//     can go back to the online policy and plan again. OutUntil(s) while op p runs: the plan's answer for s's value
//     at position p (s held out after op p in the recorded run), or -1 (resident in the plan, not a value of this
//     iteration, or departed).
//   - Storage slots may be reused after a storage dies: OnOp's registration of a slot replaces what it named.
//   - An IterationPlan is immutable once built and may be shared between threads (a planner thread builds it, the
//     training thread follows it).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/engine.h"

namespace remat {

struct IterationPlan {
  struct PlannedOp {
    std::string name;
    std::uint32_t made = 0;        // storages the op made
    std::uint32_t first_value = 0; // index of its first value
    std::int64_t made_bytes = 0;   // their bytes: another shape is another op
  };
  struct OutInterval {
    std::int64_t from = 0;
    std::int64_t until = EvictionPlan::kNeverBack;
  };
  std::vector<PlannedOp> ops;
  std::vector<std::vector<OutInterval>> out;  // per value, in order
  std::string source;      // the schedule it was taken from (a policy name)
  double overhead = 0;     // that schedule's overhead on the recorded iteration
  std::int64_t budget = 0; // the budget it was planned for

  std::size_t value_count() const { return out.size(); }
  // The plan's answer for `value` at `position` (see the contract): -1 when resident.
  std::int64_t OutUntil(std::uint32_t value, std::int64_t position) const;
};

class PlanRecorder {
 public:
  // After each original op of the watched run: its name and the storages it made, in order.
  void OnOp(const Engine& engine, std::string_view name, std::span<const StorageIndex> made);
  // The plan of the run watched so far.
  IterationPlan Finish(std::string source, double overhead, std::int64_t budget);

 private:
  IterationPlan plan_;
  std::vector<StorageIndex> storage_of_;         // per value
  std::vector<bool> out_now_;                    // per value: out after the last op
  std::vector<std::uint32_t> live_;              // values still tracked (not retired)
  absl::flat_hash_map<StorageIndex, std::uint32_t> value_of_;
};

class PlanFollower final : public EvictionPlan {
 public:
  explicit PlanFollower(std::shared_ptr<const IterationPlan> plan) : plan_(std::move(plan)) {}
  // After each original op (see the contract). Returns false once departed.
  // `made_bytes`: their summed bytes as the recorded run counted them (a replay counts a constant outside the
  // budgeted memory, and what is written in place in it, as 0 bytes; runtime/replay.h, integration/plan_driver.h).
  bool OnOp(std::string_view name, std::span<const StorageIndex> made, std::int64_t made_bytes);
  std::int64_t OutUntil(StorageIndex s) const override;
  bool departed() const { return !departure_.empty(); }
  const std::string& departure() const { return departure_; }
  std::int64_t position() const { return position_; }
  bool finished() const { return position_ == static_cast<std::int64_t>(plan_->ops.size()); }
  const IterationPlan& plan() const { return *plan_; }

 private:
  std::shared_ptr<const IterationPlan> plan_;
  std::int64_t position_ = 0;
  std::string departure_;
  absl::flat_hash_map<StorageIndex, std::uint32_t> value_of_;
};

}  // namespace remat
