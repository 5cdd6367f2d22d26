#include "tools/rotor_planner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "tools/chain_view.h"
#include "tools/schedule_check.h"

namespace remat::plan {
namespace {

constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max() / 4;
constexpr std::int64_t kMaxEntries = 8'000'000;

std::int64_t Bytes(const PlanProblem& p, const std::vector<std::int32_t>& values) {
  std::int64_t sum = 0;
  for (std::int32_t v : values) sum += p.values[v].bytes;
  return sum;
}

// The peak of (counted resident bytes + outputs) over ops [begin, end) run alone: `original` runs every op (an
// in-place write consumes its input), otherwise those a recomputation runs (ChainView::rerun; an in-place write then
// makes a copy).
// `counted` values are resident at the start and counted, `held` resident and neither counted nor freed; values in
// `keep` stay to the end, the others go after their last touch in the run; `pinned` values are held too (a making
// of one adds its bytes as an output, as in the checker). -1 when an op reads what is not there.
std::int64_t RunPeak(const PlanProblem& p, std::int32_t begin, std::int32_t end, bool original,
                     const std::vector<std::int32_t>& counted, const std::vector<std::int32_t>& held,
                     const std::vector<std::int32_t>& keep, const ChainView& chain) {
  const std::vector<std::int32_t>& pinned = chain.pinned;
  enum State : std::uint8_t { kAbsent, kCounted, kHeld };
  std::vector<std::uint8_t> state(p.values.size(), kAbsent);
  std::vector<bool> kept(p.values.size(), false);
  std::vector<std::int32_t> last(p.values.size(), -1);
  std::int64_t used = 0, peak = 0;
  for (std::int32_t v : counted) {
    state[v] = kCounted;
    used += p.values[v].bytes;
  }
  for (std::int32_t v : held) state[v] = kHeld;
  for (std::int32_t v : pinned) state[v] = kHeld;
  for (std::int32_t v : keep) kept[v] = true;
  auto runs = [&](std::int32_t k) { return original || chain.rerun[k]; };
  for (std::int32_t k = begin; k < end; ++k) {
    if (!runs(k)) continue;
    for (std::int32_t v : p.ops[k].inputs) last[v] = k;
    for (std::int32_t v : p.ops[k].fresh) last[v] = k;
    for (const auto& [old_value, made] : p.ops[k].in_place) last[made] = k;
  }
  peak = used;
  for (std::int32_t k = begin; k < end; ++k) {
    if (!runs(k)) continue;
    const PlanOp& op = p.ops[k];
    std::int64_t out = 0;
    for (std::int32_t v : op.inputs) {
      if (state[v] == kAbsent) return -1;
    }
    for (std::int32_t v : op.fresh) out += p.values[v].bytes;
    if (!original) {
      for (const auto& [old_value, made] : op.in_place) out += p.values[made].bytes;
    }
    peak = std::max(peak, used + out);
    auto make = [&](std::int32_t v) {
      if (state[v] == kHeld) return;  // pinned: resident throughout, counted outside
      if (state[v] == kAbsent) used += p.values[v].bytes;
      state[v] = kCounted;
    };
    for (std::int32_t v : op.fresh) make(v);
    for (const auto& [old_value, made] : op.in_place) {
      if (original) {
        if (state[old_value] == kCounted) used -= p.values[old_value].bytes;
        state[old_value] = kAbsent;
      }
      make(made);
    }
    auto maybe_free = [&](std::int32_t v) {
      if (last[v] == k && !kept[v] && state[v] == kCounted) {
        state[v] = kAbsent;
        used -= p.values[v].bytes;
      }
    };
    for (std::int32_t v : op.inputs) maybe_free(v);
    for (std::int32_t v : op.fresh) maybe_free(v);
    for (const auto& [old_value, made] : op.in_place) maybe_free(made);
  }
  return peak;
}

// Rotor's table, in units, memoized over the states the recursion reaches.
struct Dp {
  std::int32_t L = 0;
  std::int64_t slots = 0;
  std::vector<std::int64_t> f, x, tape, carried;  // per stage: forward time; sizes in units
  std::vector<bool> reads_input;
  std::vector<std::array<std::array<std::int64_t, 2>, 2>> pf;  // [stage][all][input freed]
  std::vector<std::array<std::int64_t, 2>> pb;                 // [stage][input counted]
  std::vector<bool> tape_is_x;                                 // F_all makes nothing F_no does not
  std::vector<bool> needs_tape;                                // B_l reads a value of F_l
  std::vector<std::int32_t> bwd_begin, bwd_end;                // B_l's ops
  std::vector<std::int64_t> cost;
  // -1: F_all (unless `have`) then B (s == t); -2: F_all, C(s+1, t), B; next + kKeep * keep: checkpoint at next;
  // -3: nothing (B_s..B_t have no op, after the first forward pass).
  std::vector<std::int32_t> choice;
  static constexpr std::int32_t kKeep = 1 << 20;

  std::int64_t Xin(std::int32_t s) const { return s > 0 ? x[s - 1] : 0; }
  std::size_t Index(std::int32_t s, std::int32_t t, std::int64_t m, bool own, bool have) const {
    return ((static_cast<std::size_t>(s) * L + t) * static_cast<std::size_t>(slots + 1) + m) * 4 + (own ? 1 : 0) +
           (have ? 2 : 0);
  }
  bool ForwardAll(std::int32_t s, std::int32_t t, std::int64_t m, bool own) const {
    if (own && !reads_input[s]) return carried[t] + pf[s][1][1] <= m;
    return carried[t] + (own ? Xin(s) : 0) + pf[s][1][0] <= m;
  }
  // `own`: x^{s-1} is counted in m and may go once nothing here reads it. `have`: stage t's tape (= x^t) is
  // resident already, counted in m: F_t need not run again before B_t.
  std::int64_t C(std::int32_t s, std::int32_t t, std::int64_t m, bool own, bool have) {
    if (m < 0) return kInf;
    const std::size_t i = Index(s, t, m, own, have);
    if (cost[i] >= 0) return cost[i];
    std::int64_t best = kInf;
    std::int32_t chosen = 0;
    const std::int64_t xi = own ? Xin(s) : 0;
    const bool input_in_b = own && reads_input[s];
    const bool b_fits = pb[s][input_in_b ? 1 : 0] <= m;
    if (t < L - 1 && bwd_begin[t] == bwd_end[s]) {
      best = 0;  // B_s..B_t are empty: nothing to run (a recomputation would come after the trace's last op)
      chosen = -3;
    } else if (s == t) {
      // After the first forward pass (t < L - 1), B_t needs F_t again only for what it reads of it.
      const bool skip = t < L - 1 && (have || !needs_tape[t]);
      if (b_fits && (skip || ForwardAll(s, t, m, own))) {
        best = skip ? 0 : f[s];
        chosen = -1;
      }
    } else {
      if (b_fits && ForwardAll(s, t, m, own)) {
        const std::int64_t sub = C(s + 1, t, m - tape[s] - (input_in_b ? Xin(s) : 0), false, have);
        if (sub < kInf) {
          best = f[s] + sub;
          chosen = -2;
        }
      }
      if (carried[t] + xi + pf[s][0][0] <= m) {
        std::int64_t forward = f[s];
        for (std::int32_t next = s + 1; next <= t; ++next) {
          if (next > s + 1) {
            if (carried[t] + xi + pf[next - 1][0][1] > m) break;
            forward += f[next - 1];
          }
          for (bool keep : {false, true}) {
            // keep: x^{next-1} stays for B_{next-1} (it is that stage's whole tape), held outside the right part.
            if (keep && !tape_is_x[next - 1]) continue;
            const std::int64_t right =
                keep ? C(next, t, m - xi - x[next - 1], false, have) : C(next, t, m - xi, true, have);
            if (right >= kInf || forward + right >= best) continue;
            const std::int64_t left = C(s, next - 1, m, own, keep);
            if (left < kInf && forward + right + left < best) {
              best = forward + right + left;
              chosen = next + (keep ? kKeep : 0);
            }
          }
        }
      }
    }
    cost[i] = best;
    choice[i] = chosen;
    return best;
  }
};

}  // namespace

absl::StatusOr<RotorOutcome> PlanRotor(const PlanProblem& problem, std::int64_t budget, const RotorOptions& options) {
  const auto begin = std::chrono::steady_clock::now();
  RotorOutcome outcome;
  absl::StatusOr<ChainView> chain = FindChain(problem, options.max_ops, options.max_stages);
  if (!chain.ok()) {
    outcome.status = PlanStatus::kTooBig;
    outcome.message = std::string(chain.status().message());
    return outcome;
  }
  const std::int32_t L = static_cast<std::int32_t>(chain->stages.size());
  if (L >= Dp::kKeep) return absl::InternalError("too many stages");
  outcome.stages = L;
  outcome.finest_stages = chain->finest_stages;
  // Stage by stage, in bytes.
  Dp dp;
  dp.L = L;
  dp.f.resize(L);
  dp.x.resize(L);
  dp.tape.resize(L);
  dp.carried.resize(L);
  dp.reads_input.resize(L);
  dp.tape_is_x.resize(L);
  dp.needs_tape.resize(L);
  dp.bwd_begin.resize(L);
  dp.bwd_end.resize(L);
  dp.pf.resize(L);
  dp.pb.resize(L);
  std::vector<std::int32_t> none, outputs;
  for (std::size_t v = 0; v < problem.values.size(); ++v) {
    if (problem.values[v].output) outputs.push_back(static_cast<std::int32_t>(v));
  }
  for (std::int32_t l = 0; l < L; ++l) {
    const ChainStage& s = chain->stages[l];
    const std::vector<std::int32_t>& input = l > 0 ? chain->stages[l - 1].x : none;
    for (std::int32_t k = s.fwd_begin; k < s.fwd_end; ++k) {
      if (chain->rerun[k]) dp.f[l] += problem.ops[k].time_ns;
    }
    dp.x[l] = Bytes(problem, s.x);
    dp.tape[l] = Bytes(problem, s.tape);
    dp.carried[l] = Bytes(problem, s.carried);
    dp.reads_input[l] = s.reads_input;
    dp.bwd_begin[l] = s.bwd_begin;
    dp.bwd_end[l] = s.bwd_end;
    dp.tape_is_x[l] = s.tape.size() == s.x.size();
    // What of its tape B_l reads: the rest (x^l read only by stage l + 1) is gone by the time B_l runs.
    std::vector<std::int32_t> read_tape;
    for (std::int32_t v : s.tape) {
      bool read = false;
      for (std::int32_t k = s.bwd_begin; k < s.bwd_end && !read; ++k) {
        read = std::find(problem.ops[k].inputs.begin(), problem.ops[k].inputs.end(), v) != problem.ops[k].inputs.end();
      }
      if (read) read_tape.push_back(v);
    }
    dp.needs_tape[l] = !read_tape.empty();
    for (int all = 0; all < 2; ++all) {
      for (int freed = 0; freed < 2; ++freed) {
        const std::vector<std::int32_t>& keep = all ? s.tape : s.x;
        std::int64_t peak = 0;
        for (bool original : {true, false}) {
          const std::int64_t run = RunPeak(problem, s.fwd_begin, s.fwd_end, original, freed ? input : none,
                                           freed ? none : input, keep, *chain);
          if (run < 0) return absl::InternalError(absl::StrCat("forward stage ", l, " reads what its view lacks"));
          peak = std::max(peak, run);
        }
        dp.pf[l][all][freed] = peak;
      }
    }
    const std::vector<std::int32_t>& after = l > 0 ? chain->stages[l - 1].carried : outputs;
    for (int counted = 0; counted < 2; ++counted) {
      std::vector<std::int32_t> start = read_tape;
      start.insert(start.end(), s.carried.begin(), s.carried.end());
      if (counted) start.insert(start.end(), input.begin(), input.end());
      const std::int64_t run =
          RunPeak(problem, s.bwd_begin, s.bwd_end, true, start, counted ? none : input, after, *chain);
      if (run < 0) return absl::InternalError(absl::StrCat("backward stage ", l, " reads what its view lacks"));
      dp.pb[l][counted] = run;
    }
  }
  const std::int64_t constants =
      *std::max_element(problem.stage_constant_bytes.begin(), problem.stage_constant_bytes.end());
  const std::int64_t memory = budget - constants - Bytes(problem, chain->pinned);
  auto infeasible = [&](std::string why) {
    outcome.status = PlanStatus::kInfeasible;
    outcome.message = std::move(why);
    outcome.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    return outcome;
  };
  if (memory <= 0) return infeasible("the constants (and pinned forward outputs) alone fill the budget");
  // Units.
  std::int64_t unit = 0;
  auto gather = [&](std::int64_t q) { unit = std::gcd(unit, q); };
  for (std::int32_t l = 0; l < L; ++l) {
    for (std::int64_t q : {dp.x[l], dp.tape[l], dp.carried[l], dp.pb[l][0], dp.pb[l][1]}) gather(q);
    for (const auto& row : dp.pf[l]) {
      for (std::int64_t q : row) gather(q);
    }
  }
  if (unit == 0) unit = 1;
  const std::int64_t table_slots = std::max<std::int64_t>(
      1, std::min<std::int64_t>(options.max_slots, kMaxEntries / (4 * static_cast<std::int64_t>(L) * L)));
  outcome.exact = memory / unit <= table_slots;
  if (!outcome.exact) unit = (memory + table_slots - 1) / table_slots;
  outcome.unit_bytes = unit;
  auto up = [&](std::int64_t q) { return (q + unit - 1) / unit; };
  for (std::int32_t l = 0; l < L; ++l) {
    dp.x[l] = up(dp.x[l]);
    dp.tape[l] = up(dp.tape[l]);
    dp.carried[l] = up(dp.carried[l]);
    for (auto& row : dp.pf[l]) {
      for (std::int64_t& q : row) q = up(q);
    }
    for (std::int64_t& q : dp.pb[l]) q = up(q);
  }
  dp.slots = memory / unit;
  const std::size_t entries = static_cast<std::size_t>(L) * L * static_cast<std::size_t>(dp.slots + 1) * 4;
  dp.cost.assign(entries, -1);
  dp.choice.assign(entries, 0);
  const std::int64_t best = dp.C(0, L - 1, dp.slots, false, false);
  if (best >= kInf) {
    return infeasible(absl::StrCat("no schedule of the DP's form fits (", L, " stages, ",
                                   outcome.exact ? "exact" : "rounded", " units of ", unit, " bytes)"));
  }
  // The schedule.
  std::vector<bool> ran(L, false);
  auto forward = [&](std::int32_t l) {
    for (std::int32_t k = chain->stages[l].fwd_begin; k < chain->stages[l].fwd_end; ++k) {
      if (!ran[l] || chain->rerun[k]) outcome.schedule.push_back(k);
    }
    ran[l] = true;
  };
  auto backward = [&](std::int32_t l) {
    for (std::int32_t k = chain->stages[l].bwd_begin; k < chain->stages[l].bwd_end; ++k) outcome.schedule.push_back(k);
  };
  auto emit = [&](auto&& self, std::int32_t s, std::int32_t t, std::int64_t m, bool own, bool have) -> void {
    const std::int32_t c = dp.choice[dp.Index(s, t, m, own, have)];
    const bool input_in_b = own && dp.reads_input[s];
    if (c == -3) return;
    if (c == -1) {
      if (!(t < L - 1 && (have || !dp.needs_tape[t]))) forward(s);
      backward(s);
      return;
    }
    if (c == -2) {
      forward(s);
      self(self, s + 1, t, m - dp.tape[s] - (input_in_b ? dp.Xin(s) : 0), false, have);
      backward(s);
      return;
    }
    const bool keep = c >= Dp::kKeep;
    const std::int32_t next = c % Dp::kKeep;
    const std::int64_t xi = own ? dp.Xin(s) : 0;
    for (std::int32_t j = s; j < next; ++j) forward(j);
    if (keep) {
      self(self, next, t, m - xi - dp.x[next - 1], false, have);
    } else {
      self(self, next, t, m - xi, true, have);
    }
    self(self, s, next - 1, m, own, keep);
  };
  emit(emit, 0, L - 1, dp.slots, false, false);
  outcome.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::int64_t first_runs = 0;
  for (std::int64_t f : dp.f) first_runs += f;
  const double compute = static_cast<double>(std::max<std::int64_t>(1, problem.compute_ns));
  outcome.dp_overhead = static_cast<double>(problem.compute_ns + best - first_runs) / compute;
  const ScheduleVerdict verdict = CheckSchedule(problem, budget, outcome.schedule);
  if (!verdict.valid) return absl::InternalError(absl::StrCat("the DP's schedule fails the check: ", verdict.violation));
  // The DP's optimum is the optimum of Rotor's schedules only for the finest stages and exact units.
  outcome.status = outcome.exact && L == chain->finest_stages ? PlanStatus::kOptimal : PlanStatus::kFeasible;
  outcome.overhead = verdict.overhead;
  outcome.peak_bytes = verdict.peak_bytes;
  outcome.recomputations = verdict.recomputations;
  return outcome;
}

}  // namespace remat::plan
