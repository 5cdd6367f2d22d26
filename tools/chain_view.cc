#include "tools/chain_view.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace remat::plan {
namespace {

std::string OpName(const PlanProblem& p, std::int32_t k) {
  return absl::StrCat("op ", k, " (", p.ops[k].name, ", trace line ", p.ops[k].line, ")");
}

// One turn's attempt: the stages it reaches, or why not.
struct Attempt {
  ChainView view;
  std::string reason;  // the last merge
};

// The forward values a schedule keeps from their making on: final outputs, and what an op makes that reads a
// constant released before the last op (a recomputation in the backward might come too late for it). So every op
// a recomputation runs reads constants that stay to the end.
std::vector<bool> Pinned(const PlanProblem& p, std::int32_t turn) {
  const std::int32_t n = static_cast<std::int32_t>(p.ops.size());
  std::vector<bool> pinned(p.values.size(), false);
  for (std::size_t v = 0; v < p.values.size(); ++v) {
    const std::int32_t g = p.values[v].producer;
    if (g >= turn) continue;
    bool stuck = p.values[v].output;
    for (std::int32_t c : p.ops[g].constant_inputs) stuck = stuck || p.constant_death[c] < n;
    pinned[v] = stuck;
  }
  return pinned;
}

// The view of a stage assignment (forward ops' stages non-decreasing, backward ops' non-increasing).
ChainView BuildView(const PlanProblem& p, std::int32_t turn, std::int32_t stages,
                    const std::vector<std::int32_t>& op_stage, const std::vector<std::vector<std::int32_t>>& readers) {
  const std::vector<bool> pinned = Pinned(p, turn);
  const std::int32_t n = static_cast<std::int32_t>(p.ops.size());
  ChainView view;
  view.turn = turn;
  view.op_stage = op_stage;
  view.stages.resize(stages);
  for (std::int32_t l = 0; l < stages; ++l) {
    ChainStage& s = view.stages[l];
    s.fwd_begin = turn;
    s.fwd_end = 0;
    for (std::int32_t f = 0; f < turn; ++f) {
      if (op_stage[f] == l) {
        s.fwd_begin = std::min(s.fwd_begin, f);
        s.fwd_end = f + 1;
      }
    }
    s.bwd_begin = s.bwd_end = n;
    for (std::int32_t b = n - 1; b >= turn; --b) {
      if (op_stage[b] <= l) s.bwd_begin = b;
      if (op_stage[b] < l) s.bwd_end = b;
    }
  }
  for (std::size_t v = 0; v < p.values.size(); ++v) {
    const std::int32_t g = p.values[v].producer;
    if (g >= turn) continue;
    if (pinned[v]) {
      view.pinned.push_back(static_cast<std::int32_t>(v));
      continue;
    }
    ChainStage& s = view.stages[op_stage[g]];
    bool outside = false, by_backward = false;
    for (std::int32_t k : readers[v]) {
      if (op_stage[k] != op_stage[g]) outside = true;
      if (k >= turn && op_stage[k] == op_stage[g]) by_backward = true;
    }
    if (outside) s.x.push_back(static_cast<std::int32_t>(v));
    if (outside || by_backward) s.tape.push_back(static_cast<std::int32_t>(v));
  }
  view.rerun.assign(n, false);
  for (std::int32_t k = 0; k < turn; ++k) {
    bool unpinned = false;
    for (std::int32_t v : p.ops[k].fresh) unpinned = unpinned || !pinned[v];
    for (const auto& [old_value, made] : p.ops[k].in_place) unpinned = unpinned || !pinned[made];
    view.rerun[k] = unpinned;
  }
  for (std::int32_t l = 1; l < stages; ++l) {
    ChainStage& s = view.stages[l];
    const std::vector<std::int32_t>& prev = view.stages[l - 1].x;
    for (std::int32_t b = s.bwd_begin; b < s.bwd_end && !s.reads_input; ++b) {
      for (std::int32_t v : p.ops[b].inputs) {
        if (std::find(prev.begin(), prev.end(), v) != prev.end()) s.reads_input = true;
      }
    }
  }
  for (ChainStage& s : view.stages) {
    for (std::size_t v = 0; v < p.values.size(); ++v) {
      const std::int32_t g = p.values[v].producer;
      if (g < turn || g >= s.bwd_begin) continue;
      const bool later = p.values[v].output || std::any_of(readers[v].begin(), readers[v].end(),
                                                           [&](std::int32_t k) { return k >= s.bwd_begin; });
      if (later) s.carried.push_back(static_cast<std::int32_t>(v));
    }
  }
  return view;
}

Attempt TryTurn(const PlanProblem& p, std::int32_t turn, const std::vector<std::vector<std::int32_t>>& readers) {
  Attempt a;
  const std::int32_t n = static_cast<std::int32_t>(p.ops.size());
  auto producer = [&](std::int32_t v) { return p.values[v].producer; };
  // A pinned forward value (Pinned) stays resident: it constrains no stage.
  const std::vector<bool> pinned = Pinned(p, turn);
  std::vector<bool> cut(turn + 1, false);  // cut[c]: a stage begins at op c
  for (std::int32_t c = 1; c < turn; ++c) cut[c] = true;
  std::vector<std::int32_t> stage(turn), start, assigned(n);
  auto remove_cuts = [&](std::int32_t from, std::int32_t to) {  // the cuts at ops (from, to]
    for (std::int32_t c = from + 1; c <= to; ++c) cut[c] = false;
  };
  auto consumed = [&](std::int32_t k, std::int32_t v) {
    for (const auto& [old_value, made] : p.ops[k].in_place) {
      if (old_value == v) return true;
    }
    return false;
  };
  for (;;) {
    start.assign(1, 0);
    for (std::int32_t f = 0; f < turn; ++f) {
      if (f > 0 && cut[f]) start.push_back(f);
      stage[f] = static_cast<std::int32_t>(start.size()) - 1;
    }
    const std::int32_t stages = static_cast<std::int32_t>(start.size());
    auto merge = [&](std::int32_t lo, std::int32_t hi, std::string why) {  // stages lo..hi become one
      remove_cuts(start[lo], hi + 1 < stages ? start[hi + 1] - 1 : turn - 1);
      a.reason = std::move(why);
    };
    bool restart = false;
    for (std::int32_t f = 0; f < turn && !restart; ++f) {
      for (std::int32_t v : p.ops[f].inputs) {
        if (pinned[v]) continue;
        const std::int32_t g = producer(v);
        const bool in_place = consumed(f, v);
        if (stage[f] - stage[g] > (in_place ? 0 : 1)) {
          merge(stage[g] + (in_place ? 0 : 1), stage[f],
                absl::StrCat(OpName(p, f), in_place ? " writes in place" : " reads", " the value of ", OpName(p, g),
                             in_place ? ", made in another stage" : ", more than one stage back"));
          restart = true;
          break;
        }
      }
    }
    if (restart) continue;
    std::int32_t cur = stages - 1;
    for (std::int32_t b = turn; b < n && !restart; ++b) {
      std::int32_t hi = -1, lo = stages, written = stages;
      for (std::int32_t v : p.ops[b].inputs) {
        if (producer(v) >= turn || pinned[v]) continue;
        hi = std::max(hi, stage[producer(v)]);
        lo = std::min(lo, stage[producer(v)]);
        if (consumed(b, v)) written = std::min(written, stage[producer(v)]);
      }
      if (hi < 0) {
        assigned[b] = cur;
        continue;
      }
      if (hi > cur) {
        merge(cur, hi, absl::StrCat(OpName(p, b), " in the backward reads the forward of a stage whose backward "
                                                  "has already begun"));
        restart = true;
      } else if (lo < hi - 1) {
        merge(lo + 1, hi, absl::StrCat(OpName(p, b), " in the backward reads forward values of stages ", lo,
                                       " and ", hi));
        restart = true;
      } else if (written < hi) {
        merge(written, hi, absl::StrCat(OpName(p, b), " writes in place a forward value of an earlier stage"));
        restart = true;
      }
      assigned[b] = cur = hi;
    }
    if (!restart) break;
  }
  std::vector<std::int32_t> op_stage(n);
  for (std::int32_t k = 0; k < n; ++k) op_stage[k] = k < turn ? stage[k] : assigned[k];
  a.view = BuildView(p, turn, static_cast<std::int32_t>(start.size()), op_stage, readers);
  return a;
}

}  // namespace

absl::StatusOr<ChainView> FindChain(const PlanProblem& problem, std::int32_t max_ops, std::int32_t max_stages) {
  const std::int32_t n = static_cast<std::int32_t>(problem.ops.size());
  if (n > max_ops) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not searched for a chain: ", n, " ops, above the limit of ", max_ops,
        " for the stage search; plan a part of the trace with --segment FIRST+COUNT"));
  }
  std::vector<std::vector<std::int32_t>> readers(problem.values.size());
  for (std::int32_t k = 0; k < n; ++k) {
    for (std::int32_t v : problem.ops[k].inputs) readers[v].push_back(k);
  }
  Attempt best;
  bool have = false;
  for (std::int32_t turn = 1; turn < n; ++turn) {
    Attempt a = TryTurn(problem, turn, readers);
    if (!have || a.view.stages.size() > best.view.stages.size()) {
      best = std::move(a);
      have = true;
    }
  }
  if (have && best.view.stages.size() >= 2) {
    ChainView view = std::move(best.view);
    view.finest_stages = static_cast<std::int32_t>(view.stages.size());
    if (view.finest_stages <= max_stages) return view;
    // Merge neighbours, the pair of least forward time first, until max_stages remain.
    std::vector<std::int64_t> time;
    std::vector<std::int32_t> group(view.finest_stages);  // finest stage -> its group
    for (std::int32_t l = 0; l < view.finest_stages; ++l) {
      std::int64_t ns = 0;
      for (std::int32_t f = view.stages[l].fwd_begin; f < view.stages[l].fwd_end; ++f) ns += problem.ops[f].time_ns;
      time.push_back(ns);
      group[l] = l;
    }
    while (static_cast<std::int32_t>(time.size()) > std::max<std::int32_t>(2, max_stages)) {
      std::size_t pair = 0;
      for (std::size_t l = 1; l + 1 < time.size(); ++l) {
        if (time[l] + time[l + 1] < time[pair] + time[pair + 1]) pair = l;
      }
      time[pair] += time[pair + 1];
      time.erase(time.begin() + static_cast<std::ptrdiff_t>(pair) + 1);
      for (std::int32_t& g : group) {
        if (g > static_cast<std::int32_t>(pair)) --g;
      }
    }
    std::vector<std::int32_t> op_stage = view.op_stage;
    for (std::int32_t& l : op_stage) l = group[l];
    const std::int32_t finest = view.finest_stages;
    view = BuildView(problem, view.turn, static_cast<std::int32_t>(time.size()), op_stage, readers);
    view.finest_stages = finest;
    return view;
  }
  const std::string why =
      have ? absl::StrCat("with the backward from op ", best.view.turn, ", every stage merges into one",
                          best.reason.empty() ? "" : absl::StrCat(" (last merge: ", best.reason, ")"))
           : "fewer than 2 ops";
  return absl::FailedPreconditionError(absl::StrCat(
      "not a chain: no split into forward stages and backward stages in reverse order with 2 or more stages (",
      why, "); Rotor's dynamic program does not apply, use --planner checkmate"));
}

}  // namespace remat::plan
