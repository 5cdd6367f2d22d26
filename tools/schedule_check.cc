#include "tools/schedule_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace remat::plan {
namespace {

bool Consumed(const PlanOp& op, std::int32_t v) {
  for (const auto& [old_value, made] : op.in_place) {
    if (old_value == v) return true;
  }
  return false;
}

}  // namespace

std::vector<std::int32_t> OriginalOrder(const PlanProblem& problem) {
  std::vector<std::int32_t> order(problem.ops.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<std::int32_t>(k);
  return order;
}

ScheduleVerdict CheckSchedule(const PlanProblem& problem, std::int64_t budget, const std::vector<std::int32_t>& schedule) {
  ScheduleVerdict verdict;
  const std::int32_t n_ops = static_cast<std::int32_t>(problem.ops.size());
  auto fail = [&](std::size_t position, std::int32_t k, const std::string& reason) {
    verdict.valid = false;
    verdict.violation = absl::StrCat("schedule position ", position, ", op ", k);
    if (k >= 0 && k < n_ops) {
      absl::StrAppend(&verdict.violation, " (", problem.ops[k].name, ", trace line ", problem.ops[k].line, ")");
    }
    absl::StrAppend(&verdict.violation, ": ", reason);
    return verdict;
  };
  // Stages, and which executions are originals.
  std::vector<std::int32_t> stage(schedule.size());
  std::int32_t next_original = 0;
  for (std::size_t e = 0; e < schedule.size(); ++e) {
    const std::int32_t k = schedule[e];
    if (k < 0 || k >= n_ops) return fail(e, k, "no such op");
    stage[e] = next_original;
    if (k == next_original) {
      ++next_original;
    } else if (k > next_original) {
      return fail(e, k, absl::StrCat("runs before its place (op ", next_original, " has not run yet)"));
    } else if (!problem.ops[k].recomputable()) {
      return fail(e, k, "recomputed, but it makes no value (a view or a write to constants): it runs once");
    }
  }
  if (next_original != n_ops) {
    return fail(schedule.size(), next_original, "never runs (every op must run once at its place)");
  }
  // Backward: after which execution each value can go (its next touch is not a read, and it is not a final output
  // that is never made again).
  enum class Next : std::uint8_t { kNone, kRead, kMade };
  std::vector<Next> next(problem.values.size(), Next::kNone);
  std::vector<std::vector<std::int32_t>> frees(schedule.size());
  auto can_go = [&](std::int32_t v) {
    return next[v] == Next::kMade || (next[v] == Next::kNone && !problem.values[v].output);
  };
  for (std::size_t e = schedule.size(); e-- > 0;) {
    const PlanOp& op = problem.ops[schedule[e]];
    const bool original = stage[e] == schedule[e];
    for (std::int32_t v : op.fresh) {
      if (can_go(v)) frees[e].push_back(v);
    }
    for (const auto& [old_value, made] : op.in_place) {
      if (can_go(made)) frees[e].push_back(made);
    }
    for (std::int32_t v : op.inputs) {
      if ((!original || !Consumed(op, v)) && can_go(v)) frees[e].push_back(v);
    }
    for (std::int32_t v : op.fresh) next[v] = Next::kMade;
    for (const auto& [old_value, made] : op.in_place) next[made] = Next::kMade;
    for (std::int32_t v : op.inputs) next[v] = Next::kRead;
  }
  // Forward: residency and bytes.
  std::vector<bool> resident(problem.values.size(), false);
  std::int64_t used = 0;  // resident values' bytes
  for (std::size_t e = 0; e < schedule.size(); ++e) {
    const std::int32_t k = schedule[e];
    const PlanOp& op = problem.ops[k];
    const std::int32_t t = stage[e];
    for (std::int32_t c : op.constant_inputs) {
      if (t >= problem.constant_death[c]) {
        return fail(e, k, absl::StrCat("reads constant ", c, " in stage ", t, ", after its release (stage ",
                                       problem.constant_death[c], ")"));
      }
    }
    for (std::int32_t v : op.inputs) {
      if (!resident[v]) {
        return fail(e, k, absl::StrCat("reads value ", v, " (made by op ", problem.values[v].producer,
                                       "), which is not resident"));
      }
    }
    // The original of an in-place write takes over its input's bytes; a replay of it writes a new copy (the engine
    // keeps the old value resident: runtime/engine.cc replays an in-place op out of place).
    const bool original = t == k;
    std::int64_t out_bytes = 0;
    for (std::int32_t v : op.fresh) out_bytes += problem.values[v].bytes;
    if (!original) {
      for (const auto& [old_value, made] : op.in_place) out_bytes += problem.values[made].bytes;
    }
    const std::int64_t need = problem.stage_constant_bytes[t] + used + out_bytes;
    if (need > budget) {
      return fail(e, k, absl::StrCat("needs ", need, " bytes in use with its outputs, over the budget of ", budget,
                                     " (constants ", problem.stage_constant_bytes[t], ", values ", used,
                                     ", outputs ", out_bytes, ")"));
    }
    verdict.peak_bytes = std::max(verdict.peak_bytes, need);
    for (std::int32_t v : op.fresh) {
      if (!resident[v]) {
        resident[v] = true;
        used += problem.values[v].bytes;
      }
    }
    for (const auto& [old_value, made] : op.in_place) {
      if (original) {
        resident[old_value] = false;
        used -= problem.values[old_value].bytes;
      }
      if (!resident[made]) {
        resident[made] = true;
        used += problem.values[made].bytes;
      }
    }
    for (std::int32_t v : frees[e]) {
      if (resident[v]) {
        resident[v] = false;
        used -= problem.values[v].bytes;
      }
    }
    verdict.total_ns += op.time_ns;
    if (stage[e] > k) {  // op k's original runs in stage k
      verdict.recompute_ns += op.time_ns;
      ++verdict.recomputations;
    }
  }
  for (std::size_t v = 0; v < problem.values.size(); ++v) {
    if (problem.values[v].output && !resident[v]) {
      return fail(schedule.size(), problem.values[v].producer,
                  absl::StrCat("final output value ", v, " is not resident at the end"));
    }
  }
  verdict.valid = true;
  verdict.overhead = problem.compute_ns > 0
                         ? static_cast<double>(verdict.total_ns) / static_cast<double>(problem.compute_ns)
                         : 1.0;
  return verdict;
}

}  // namespace remat::plan
