// TraceSegment: a window of consecutive ops of a trace as a trace of its own, so that the policies (remat-sim's
// rows) and an offline planner (tools/checkmate_planner.h) can be compared on a part of a trace too big to plan
// whole, by the same rules.
//
// Contract:
//   - The window is `count` CALL/MUTATE instructions starting at the `first`-th (0-based, in file order). The segment
//     begins with one instruction per storage referenced by a name when the window begins (under the first such
//     name in binding order), and a COPY for each other name referring to that storage: for a constant of the trace,
//     a CONSTANT (its bytes); for any other storage, a `segment_input` CALL with no arguments, its bytes, and as TIME
//     its last writer's TIME (divided among that op's fresh results, or among a MUTATE's written arguments), so
//     that it can be dropped and recomputed "from the checkpointed inputs" as the whole trace could (an
//     approximation: the real recomputation may need more). Then come every instruction
//     from just after the op before the window up to (not including) the op after it, in order: the RELEASEs,
//     COPYs and CONSTANTs among them, and the window's ops. An `ANNOTATE BACKWARD` seen before the window is not
//     repeated: the product engine would defer the segment_input values of a backward window (evict them only when
//     nothing else can go), and in counter mode it then runs out of memory with them resident (seen on resnet32).
//     So in a segment the engine never defers, whereas in the whole trace it defers backward outputs.
//   - So what is live across the window's start is input (made by the segment_input ops, which count in the
//     segment's compute like any op). With `release_at_end` (remat-sim's --segment), every name still referenced
//     at the window's end is released there: nothing must be resident at the end (in a window in the middle of a
//     training step, what the rest of the step needs is most of the window's peak, so requiring it resident at the
//     end makes every budget ratio below ~0.7 infeasible for every policy and for the planner alike); without it,
//     those names are the segment's outputs. Budget ratios refer to the segment's own unconstrained peak.
//   - `path` is the trace's path with "@first+count" appended; call_count and total_time_ns are the segment's
//     (segment_input ops included).
//   - Errors: InvalidArgument when the window is empty or goes past the last op, or when an op in the window reads a
//     name bound before the window that holds no reference there (released, then read again: not supported).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/trace.h"

namespace remat {

absl::StatusOr<Trace> SegmentTrace(const Trace& trace, std::int64_t first, std::int64_t count,
                                   bool release_at_end = true);

}  // namespace remat
