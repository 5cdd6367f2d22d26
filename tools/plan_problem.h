// PlanProblem: a trace as an offline planner sees it, in the product engine configuration (remat-sim's default,
// runtime/replay.h) with counter-mode byte accounting, so that an offline schedule is judged by the same rules as
// the policies' rows.
//
// Contract:
//   - Ops are the trace's CALL and MUTATE instructions in file order (op k runs in "stage k" of a schedule; the
//     stages of a schedule are the gaps between these original executions, tools/schedule_check.h).
//   - A value is one version of a non-constant storage: each fresh CALL result makes one (its MEMORY bytes), and
//     a MUTATE makes one for each distinct non-constant storage it writes (in place: the new value takes over the
//     old value's bytes, which it consumes). A view adds no value: reading a view reads its storage's current value
//     (views come back with their storage, no view-op replay, as in kProduct).
//   - An op reads the current value of each input's storage (deduplicated) and the constants among its inputs. It is
//     recomputable when it makes at least one value; an op that makes none (view-only ops, a MUTATE of constants
//     only) runs exactly once, at its place. A constant written in place stays a constant (no value).
//   - Constants are in memory from the start (kProduct hoists them) until their storage's last external reference
//     is released (kProduct frees released constants): `constant_death[c]` is the number of ops that run before
//     that (ops.size() + 1 when never released). `stage_constant_bytes[t]` is the constant bytes in memory in stage
//     t (0 <= t <= ops.size(); stage ops.size() is the end, after the last op). An execution in stage t may read
//     constant c only when t < constant_death[c] (a stricter rule than the engine's, which may keep a constant
//     longer for a replay: a planner never relies on that).
//   - Final outputs: the current value of every non-constant storage still referenced at the end (remat-sim makes
//     them resident at the end, replaying them if evicted, and that cost counts).
//   - `compute_ns` is the summed TIME of all ops: remat-sim's baseline compute for the same trace.
//   - BuildPlanProblem fails (InvalidArgument naming the trace line) on a name that is not bound, as the replay would.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/trace.h"

namespace remat::plan {

struct PlanValue {
  std::int64_t bytes = 0;
  std::int32_t producer = -1;  // op index
  bool output = false;         // a final output: must be resident at the end
};

struct PlanOp {
  std::string name;
  std::int32_t line = 0;                     // trace line, for messages
  std::int64_t time_ns = 0;
  std::vector<std::int32_t> inputs;          // values read (distinct), in-place consumed ones included
  std::vector<std::int32_t> constant_inputs; // constants read (distinct)
  std::vector<std::int32_t> fresh;           // values it allocates (new bytes)
  std::vector<std::pair<std::int32_t, std::int32_t>> in_place;  // (consumed value, made value): same bytes
  bool recomputable() const { return !fresh.empty() || !in_place.empty(); }
};

struct PlanProblem {
  std::string path;
  std::vector<PlanValue> values;
  std::vector<PlanOp> ops;
  std::vector<std::int64_t> constant_bytes;
  std::vector<std::int32_t> constant_death;        // see the contract
  std::vector<std::int64_t> stage_constant_bytes;  // ops.size() + 1 entries
  std::int64_t compute_ns = 0;
};

absl::StatusOr<PlanProblem> BuildPlanProblem(const Trace& trace);

}  // namespace remat::plan
