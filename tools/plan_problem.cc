#include "tools/plan_problem.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace remat::plan {
namespace {

struct Storage {
  bool constant = false;
  std::int32_t id = -1;  // constant id, or the current value
  std::int64_t bytes = 0;
  std::int64_t refs = 0;
};

}  // namespace

absl::StatusOr<PlanProblem> BuildPlanProblem(const Trace& trace) {
  PlanProblem p;
  p.path = trace.path;
  std::vector<std::int32_t> bound(trace.names.size(), -1);  // name -> tensor
  std::vector<std::int32_t> tensor_storage;
  std::vector<Storage> storages;
  std::vector<std::int32_t> constant_birth;
  std::int32_t ops_run = 0;

  auto new_tensor = [&](std::int32_t storage) {
    tensor_storage.push_back(storage);
    storages[storage].refs += 1;
    return static_cast<std::int32_t>(tensor_storage.size() - 1);
  };
  auto release = [&](std::int32_t tensor) {
    Storage& s = storages[tensor_storage[tensor]];
    s.refs -= 1;
    if (s.refs == 0 && s.constant && p.constant_death[s.id] > ops_run) p.constant_death[s.id] = ops_run;
  };
  auto constant = [&](const TraceOp& op) {
    storages.push_back({true, static_cast<std::int32_t>(p.constant_bytes.size()), op.bytes, 0});
    p.constant_bytes.push_back(op.bytes);
    p.constant_death.push_back(std::numeric_limits<std::int32_t>::max());
    constant_birth.push_back(ops_run);
    bound[op.name] = new_tensor(static_cast<std::int32_t>(storages.size() - 1));
  };
  auto lookup = [&](TraceName n, const TraceOp& op) -> absl::StatusOr<std::int32_t> {
    if (bound[n] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(trace.path, ":", op.line, ": name '", trace.names[n], "' is not bound"));
    }
    return bound[n];
  };
  // kProduct hoists every constant whose name is not bound yet (runtime/replay.cc).
  std::vector<bool> hoisted(trace.ops.size(), false);
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    if (op.kind != TraceOpKind::kConstant || bound[op.name] >= 0) continue;
    constant(op);
    hoisted[i] = true;
  }
  // The op's inputs as values and constants.
  auto add_inputs = [&](const TraceOp& op, PlanOp& plan_op) -> absl::Status {
    for (TraceName a : op.args) {
      absl::StatusOr<std::int32_t> t = lookup(a, op);
      if (!t.ok()) return t.status();
      const Storage& s = storages[tensor_storage[*t]];
      std::vector<std::int32_t>& list = s.constant ? plan_op.constant_inputs : plan_op.inputs;
      if (std::find(list.begin(), list.end(), s.id) == list.end()) list.push_back(s.id);
    }
    return absl::OkStatus();
  };
  auto new_value = [&](std::int64_t bytes) {
    p.values.push_back({bytes, ops_run, false});
    return static_cast<std::int32_t>(p.values.size() - 1);
  };

  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    if (hoisted[i]) continue;
    switch (op.kind) {
      case TraceOpKind::kAnnotate:
      case TraceOpKind::kPin:  // a pinned storage is still a storage a planner may drop: PIN lines are ignored
        break;
      case TraceOpKind::kConstant:
        constant(op);
        break;
      case TraceOpKind::kCopy: {
        absl::StatusOr<std::int32_t> src = lookup(op.args[0], op);
        if (!src.ok()) return src.status();
        storages[tensor_storage[*src]].refs += 1;
        bound[op.results[0].name] = *src;
        break;
      }
      case TraceOpKind::kCopyFrom: {
        absl::StatusOr<std::int32_t> src = lookup(op.args[0], op);
        if (!src.ok()) return src.status();
        absl::StatusOr<std::int32_t> dst = lookup(op.results[0].name, op);
        if (!dst.ok()) return dst.status();
        release(*dst);
        storages[tensor_storage[*src]].refs += 1;
        bound[op.results[0].name] = *src;
        break;
      }
      case TraceOpKind::kRelease:
        if (bound[op.args[0]] >= 0) release(bound[op.args[0]]);
        break;
      case TraceOpKind::kCall: {
        PlanOp plan_op;
        plan_op.name = op.op_name;
        plan_op.line = op.line;
        plan_op.time_ns = op.time_ns;
        if (absl::Status s = add_inputs(op, plan_op); !s.ok()) return s;
        std::vector<std::int32_t> arg_storage;
        for (TraceName a : op.args) arg_storage.push_back(tensor_storage[bound[a]]);
        for (const TraceResult& r : op.results) {
          std::int32_t storage;
          if (r.alias >= 0) {
            storage = arg_storage[r.alias];
          } else {
            const std::int32_t v = new_value(r.bytes);
            plan_op.fresh.push_back(v);
            storages.push_back({false, v, r.bytes, 0});
            storage = static_cast<std::int32_t>(storages.size() - 1);
          }
          bound[r.name] = new_tensor(storage);
        }
        p.ops.push_back(std::move(plan_op));
        ++ops_run;
        break;
      }
      case TraceOpKind::kMutate: {
        PlanOp plan_op;
        plan_op.name = op.op_name;
        plan_op.line = op.line;
        plan_op.time_ns = op.time_ns;
        if (absl::Status s = add_inputs(op, plan_op); !s.ok()) return s;
        std::vector<std::int32_t> written;  // storages
        for (std::int32_t k : op.mutated) {
          const TraceName n = op.args[k];
          const std::int32_t storage = tensor_storage[bound[n]];
          if (std::find(written.begin(), written.end(), storage) != written.end()) continue;
          written.push_back(storage);
          Storage& s = storages[storage];
          if (!s.constant) {
            const std::int32_t made = new_value(s.bytes);
            plan_op.in_place.emplace_back(s.id, made);
            s.id = made;
          }
          // The name now refers to a new tensor of the same storage (the replay releases the old one).
          const std::int32_t old = bound[n];
          bound[n] = new_tensor(storage);
          release(old);
        }
        p.ops.push_back(std::move(plan_op));
        ++ops_run;
        break;
      }
    }
  }
  for (const Storage& s : storages) {
    if (!s.constant && s.refs > 0) p.values[s.id].output = true;
  }
  const std::int32_t stages = static_cast<std::int32_t>(p.ops.size()) + 1;
  p.stage_constant_bytes.assign(stages, 0);
  for (std::size_t c = 0; c < p.constant_bytes.size(); ++c) {
    p.constant_death[c] = std::min(p.constant_death[c], stages);
    for (std::int32_t t = constant_birth[c]; t < p.constant_death[c]; ++t) p.stage_constant_bytes[t] += p.constant_bytes[c];
  }
  for (const PlanOp& op : p.ops) p.compute_ns += op.time_ns;
  return p;
}

}  // namespace remat::plan
