#include "tools/schedule_check.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/link_model.h"

namespace remat::plan {
namespace {

bool Consumed(const PlanOp& op, std::int32_t v) {
  for (const auto& [old_value, made] : op.in_place) {
    if (old_value == v) return true;
  }
  return false;
}

}  // namespace

ScheduleVerdict CheckSteps(const PlanProblem& problem, std::int64_t budget, const PagingOptions* paging,
                           const std::vector<PlanStep>& steps) {
  ScheduleVerdict verdict;
  const std::int32_t n_ops = static_cast<std::int32_t>(problem.ops.size());
  const std::int32_t n_values = static_cast<std::int32_t>(problem.values.size());
  auto fail = [&](std::size_t position, std::int32_t k, const std::string& reason) {
    verdict.valid = false;
    verdict.violation = absl::StrCat("schedule position ", position, ", op ", k);
    if (k >= 0 && k < n_ops) {
      absl::StrAppend(&verdict.violation, " (", problem.ops[k].name, ", trace line ", problem.ops[k].line, ")");
    }
    absl::StrAppend(&verdict.violation, ": ", reason);
    return verdict;
  };
  auto fail_value = [&](std::size_t position, std::int32_t v, const std::string& reason) {
    verdict.valid = false;
    verdict.violation = absl::StrCat("schedule position ", position, ", value ", v, ": ", reason);
    return verdict;
  };
  // Stages, and which executions are originals.
  std::vector<std::int32_t> stage(steps.size());
  std::int32_t next_original = 0;
  for (std::size_t e = 0; e < steps.size(); ++e) {
    const std::int32_t k = steps[e].index;
    stage[e] = next_original;
    if (steps[e].kind != StepKind::kRun) {
      if (paging == nullptr) return fail_value(e, k, "a page step in a schedule without paging");
      if (k < 0 || k >= n_values) return fail_value(e, k, "no such value");
      continue;
    }
    if (k < 0 || k >= n_ops) return fail(e, k, "no such op");
    if (k == next_original) {
      ++next_original;
    } else if (k > next_original) {
      return fail(e, k, absl::StrCat("runs before its place (op ", next_original, " has not run yet)"));
    } else if (!problem.ops[k].recomputable()) {
      return fail(e, k, "recomputed, but it makes no value (a view or a write to constants): it runs once");
    }
  }
  if (next_original != n_ops) {
    return fail(steps.size(), next_original, "never runs (every op must run once at its place)");
  }
  // Backward: after which step each value can go (its next touch is not a read, and it is not a final output that
  // is never made again). A page-out counts as a read, a page-in as a making.
  enum class Next : std::uint8_t { kNone, kRead, kMade };
  std::vector<Next> next(problem.values.size(), Next::kNone);
  std::vector<std::vector<std::int32_t>> frees(steps.size());
  auto can_go = [&](std::int32_t v) {
    return next[v] == Next::kMade || (next[v] == Next::kNone && !problem.values[v].output);
  };
  for (std::size_t e = steps.size(); e-- > 0;) {
    if (steps[e].kind == StepKind::kPageOut) {
      next[steps[e].index] = Next::kRead;
      continue;
    }
    if (steps[e].kind == StepKind::kPageIn) {
      if (can_go(steps[e].index)) frees[e].push_back(steps[e].index);
      next[steps[e].index] = Next::kMade;
      continue;
    }
    const PlanOp& op = problem.ops[steps[e].index];
    const bool original = stage[e] == steps[e].index;
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
  // Forward: residency, bytes and (with paging) the link's timeline.
  std::vector<bool> resident(problem.values.size(), false), on_host(problem.values.size(), false),
      consumed(problem.values.size(), false);
  std::vector<std::int64_t> ready(problem.values.size(), 0), out_done(problem.values.size(), 0);
  std::optional<LinkModel> link;
  if (paging != nullptr) link.emplace(*paging);
  std::int64_t used = 0;  // resident values' bytes
  std::int64_t host = 0;  // host copies' bytes
  std::int64_t clock = 0;
  auto drop_host = [&](std::int32_t v) {
    if (on_host[v]) {
      on_host[v] = false;
      host -= problem.values[v].bytes;
    }
  };
  auto free_after = [&](std::size_t e) {
    for (std::int32_t v : frees[e]) {
      if (resident[v]) {
        resident[v] = false;
        used -= problem.values[v].bytes;
      }
    }
  };
  for (std::size_t e = 0; e < steps.size(); ++e) {
    const std::int32_t k = steps[e].index;
    const std::int32_t t = stage[e];
    if (steps[e].kind == StepKind::kPageOut) {
      const std::int64_t bytes = problem.values[k].bytes;
      if (!resident[k]) return fail_value(e, k, "paged out, but it is not resident");
      if (host + bytes > paging->host_budget) {
        return fail_value(e, k, absl::StrCat("paged out over the host budget of ", paging->host_budget, " bytes"));
      }
      resident[k] = false;
      used -= bytes;
      on_host[k] = true;
      host += bytes;
      verdict.host_peak_bytes = std::max(verdict.host_peak_bytes, host);
      out_done[k] = link->Issue(bytes, /*in=*/false, clock, 0);
      ++verdict.page_outs;
      continue;
    }
    if (steps[e].kind == StepKind::kPageIn) {
      const std::int64_t bytes = problem.values[k].bytes;
      if (!on_host[k] || resident[k] || consumed[k]) {
        return fail_value(e, k, "paged in, but it has no host copy (or is resident, or was written in place)");
      }
      const std::int64_t need = problem.stage_constant_bytes[t] + used + bytes;
      if (need > budget) {
        return fail_value(e, k, absl::StrCat("paged in with ", need, " bytes in use, over the budget of ", budget));
      }
      verdict.peak_bytes = std::max(verdict.peak_bytes, need);
      resident[k] = true;
      used += bytes;
      drop_host(k);
      ready[k] = link->Issue(bytes, /*in=*/true, clock, out_done[k]);
      ++verdict.page_ins;
      free_after(e);
      continue;
    }
    const PlanOp& op = problem.ops[k];
    for (std::int32_t c : op.constant_inputs) {
      if (t >= problem.constant_death[c]) {
        verdict.released_constant_read = true;
        return fail(e, k, absl::StrCat("reads constant ", c, " in stage ", t, ", after its release (stage ",
                                       problem.constant_death[c], ")"));
      }
    }
    std::int64_t start = clock;
    for (std::int32_t v : op.inputs) {
      if (!resident[v]) {
        return fail(e, k, absl::StrCat("reads value ", v, " (made by op ", problem.values[v].producer,
                                       "), which is not resident"));
      }
      start = std::max(start, ready[v]);
    }
    verdict.stall_ns += start - clock;
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
    auto make = [&](std::int32_t v) {
      drop_host(v);
      ready[v] = 0;
      consumed[v] = false;
      if (!resident[v]) {
        resident[v] = true;
        used += problem.values[v].bytes;
      }
    };
    for (std::int32_t v : op.fresh) make(v);
    for (const auto& [old_value, made] : op.in_place) {
      if (original) {
        resident[old_value] = false;
        used -= problem.values[old_value].bytes;
        drop_host(old_value);
        consumed[old_value] = true;
      }
      make(made);
    }
    free_after(e);
    clock = start + op.time_ns;
    verdict.total_ns += op.time_ns;
    if (stage[e] > k) {  // op k's original runs in stage k
      verdict.recompute_ns += op.time_ns;
      ++verdict.recomputations;
    }
  }
  for (std::size_t v = 0; v < problem.values.size(); ++v) {
    if (problem.values[v].output && !resident[v]) {
      return fail(steps.size(), problem.values[v].producer,
                  absl::StrCat("final output value ", v, " is not resident at the end"));
    }
  }
  verdict.valid = true;
  verdict.overhead = problem.compute_ns > 0 ? static_cast<double>(verdict.total_ns + verdict.stall_ns) /
                                                  static_cast<double>(problem.compute_ns)
                                            : 1.0;
  return verdict;
}

std::vector<std::int32_t> OriginalOrder(const PlanProblem& problem) {
  std::vector<std::int32_t> order(problem.ops.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<std::int32_t>(k);
  return order;
}

ScheduleVerdict CheckSchedule(const PlanProblem& problem, std::int64_t budget, const std::vector<std::int32_t>& schedule) {
  std::vector<PlanStep> steps;
  steps.reserve(schedule.size());
  for (std::int32_t k : schedule) steps.push_back({StepKind::kRun, k});
  return CheckSteps(problem, budget, nullptr, steps);
}

}  // namespace remat::plan
