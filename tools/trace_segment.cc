#include "tools/trace_segment.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace remat {
namespace {

bool IsOp(const TraceOp& op) { return op.kind == TraceOpKind::kCall || op.kind == TraceOpKind::kMutate; }

}  // namespace

absl::StatusOr<Trace> SegmentTrace(const Trace& trace, std::int64_t first, std::int64_t count, bool release_at_end) {
  if (first < 0 || count <= 0 || first + count > trace.call_count) {
    return absl::InvalidArgumentError(absl::StrCat("segment ", first, "+", count, " is outside ", trace.path,
                                                   ", which has ", trace.call_count, " ops (CALL and MUTATE)"));
  }
  // Instruction range [begin, end): after op first-1, up to op first+count.
  std::size_t begin = 0, end = trace.ops.size();
  std::int64_t seen = 0;
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    if (!IsOp(trace.ops[i])) continue;
    if (seen == first - 1) begin = i + 1;
    if (seen == first + count) {
      end = i;
      break;
    }
    ++seen;
  }
  // Bindings before the window: name -> storage, and whether the name holds a reference.
  std::vector<std::int32_t> storage_of(trace.names.size(), -1);
  std::vector<bool> holds(trace.names.size(), false);
  std::vector<std::int64_t> storage_bytes;
  std::vector<bool> storage_constant;
  std::vector<std::int64_t> storage_cost;  // its last writer's TIME (shared among the writer's fresh results)
  std::vector<TraceName> order;  // names in order of first binding
  auto bind = [&](TraceName n, std::int32_t storage) {
    if (storage_of[n] < 0) order.push_back(n);
    storage_of[n] = storage;
    holds[n] = true;
  };
  for (std::size_t i = 0; i < begin; ++i) {
    const TraceOp& op = trace.ops[i];
    switch (op.kind) {
      case TraceOpKind::kConstant:
        storage_bytes.push_back(op.bytes);
        storage_constant.push_back(true);
        storage_cost.push_back(0);
        bind(op.name, static_cast<std::int32_t>(storage_bytes.size() - 1));
        break;
      case TraceOpKind::kCall: {
        std::int64_t fresh = 0;
        for (const TraceResult& r : op.results) fresh += r.alias < 0;
        for (const TraceResult& r : op.results) {
          if (r.alias >= 0) {
            bind(r.name, storage_of[op.args[r.alias]]);
          } else {
            storage_bytes.push_back(r.bytes);
            storage_constant.push_back(false);
            storage_cost.push_back(op.time_ns / fresh);
            bind(r.name, static_cast<std::int32_t>(storage_bytes.size() - 1));
          }
        }
        break;
      }
      case TraceOpKind::kMutate:  // in place (the product's model): the names keep their storages
        for (std::int32_t k : op.mutated) {
          const std::int32_t s = storage_of[op.args[k]];
          if (!storage_constant[s]) storage_cost[s] = op.time_ns / static_cast<std::int64_t>(op.mutated.size());
        }
        break;
      case TraceOpKind::kCopy:
      case TraceOpKind::kCopyFrom:
        bind(op.results[0].name, storage_of[op.args[0]]);
        break;
      case TraceOpKind::kRelease:
        holds[op.args[0]] = false;
        break;
      case TraceOpKind::kAnnotate:  // not repeated: see the contract
      case TraceOpKind::kPin:
        break;
    }
  }
  Trace segment;
  segment.path = absl::StrCat(trace.path, "@", first, "+", count);
  segment.names = trace.names;
  std::vector<TraceName> first_name(storage_bytes.size(), -1);
  for (TraceName n : order) {
    if (!holds[n]) continue;
    const std::int32_t s = storage_of[n];
    TraceOp op;
    op.line = 0;
    if (first_name[s] < 0 && storage_constant[s]) {
      first_name[s] = n;
      op.kind = TraceOpKind::kConstant;
      op.name = n;
      op.bytes = storage_bytes[s];
    } else if (first_name[s] < 0) {
      first_name[s] = n;
      op.kind = TraceOpKind::kCall;
      op.op_name = "segment_input";
      op.time_ns = storage_cost[s];
      op.results = {TraceResult{n, storage_bytes[s], -1}};
      ++segment.call_count;
      segment.total_time_ns += op.time_ns;
    } else {
      op.kind = TraceOpKind::kCopy;
      op.args = {first_name[s]};
      op.results = {TraceResult{n, 0, -1}};
    }
    segment.ops.push_back(std::move(op));
  }
  // Names the window may read: bound inside it, or holding a reference when it begins.
  std::vector<bool> readable = holds;
  for (TraceName n = 0; n < static_cast<TraceName>(trace.names.size()); ++n) readable[n] = holds[n] && storage_of[n] >= 0;
  for (std::size_t i = begin; i < end; ++i) {
    const TraceOp& op = trace.ops[i];
    for (TraceName a : op.args) {
      if (op.kind == TraceOpKind::kRelease) break;
      if (!readable[a]) {
        return absl::InvalidArgumentError(absl::StrCat(
            trace.path, ":", op.line, ": segment ", first, "+", count, " reads '", trace.names[a],
            "', bound before the segment but holding no reference when it begins (not supported)"));
      }
    }
    if (op.kind == TraceOpKind::kConstant) readable[op.name] = true;
    for (const TraceResult& r : op.results) readable[r.name] = true;
    // References held at the window's end (released there: see the contract).
    if (op.kind == TraceOpKind::kConstant) holds[op.name] = true;
    if (op.kind == TraceOpKind::kCall || op.kind == TraceOpKind::kCopy || op.kind == TraceOpKind::kCopyFrom) {
      for (const TraceResult& r : op.results) holds[r.name] = true;
    }
    if (op.kind == TraceOpKind::kRelease) holds[op.args[0]] = false;
    segment.ops.push_back(op);
    if (IsOp(op)) {
      ++segment.call_count;
      segment.total_time_ns += op.time_ns;
    }
  }
  if (release_at_end) {
    for (TraceName n = 0; n < static_cast<TraceName>(trace.names.size()); ++n) {
      if (!holds[n] || !readable[n]) continue;
      TraceOp op;
      op.kind = TraceOpKind::kRelease;
      op.args = {n};
      segment.ops.push_back(std::move(op));
    }
  }
  return segment;
}

}  // namespace remat
