// Op effects: the one place that decides, per op, how remat may replay it (DESIGN.md, "Soundness: side effects").
//
// Replaying an op must reproduce its outputs and do nothing else. What an op writes decides how:
//
//   1. Its outputs only (most ops): replayed as recorded.
//   2. Its own inputs in place, returned (`add_`, `copy_`, out=): recomputable in place (the engine keeps the old
//      value as an evicted storage); a replay writes a private copy of the input, never the user's storage.
//   3. Other tensors, not returned: the written arguments of the schema that no return aliases, plus the writes
//      schemas do not declare (kUnannotatedWrites below: batch norm's running statistics). Replayed through a
//      side-effect-free form: the written tensors are constants (pinned), and a replay writes fresh memory in their
//      place, so the side effect is never applied twice. That needs the op's outputs not to depend on the written
//      tensors' values: true for batch norm in training mode (the only mode in which it writes them) and rrelu's
//      noise (drawn afresh), OutputsIgnoreSideWrites below; a replay then needs neither their bytes nor the engine
//      to keep them (InstanceNorm's repeated running statistics are temporaries that die inside the op). Any other
//      call that writes a tensor it does not return (QAT's fused_moving_avg_obs_fake_quant quantizes with the scale
//      it has just updated) is not replayed at all (4).
//   4. Not at all: ops whose effect is more than their outputs (collectives, profiler ranges:
//      kSideEffectNamespaces), ops that produce uninitialized memory (aten::empty and friends: a replay cannot know
//      what was written into it later), and ops that drew random numbers remat could not capture. Their outputs are
//      pinned constants, never evicted.
//
// Random ops (a Generator argument, or one of kGeneratorlessRandomOps) are replayed with the generator state
// captured at their first run (dispatch_hook.h).
//
// Everything here is data about aten's schemas that the schemas themselves do not say; schema facts (alias
// annotations, Generator arguments) are read from the schema by dispatch_hook.cc.
#pragma once

#include <ATen/core/ivalue.h>

#include <string_view>
#include <vector>

namespace remat::integration {

// Writes a schema does not declare: `arguments` are written when the bool argument `when_true` is true (-1: always).
struct UnannotatedWrite {
  std::string_view op;  // base name, e.g. "aten::native_batch_norm" (every overload)
  std::vector<int> arguments;
  int when_true = -1;
};

// The table (batch norm variants update running_mean/running_var in training mode without `(a!)`). A test checks
// every entry against the registered schemas (argument names and types), so a torch that renames them fails loudly.
const std::vector<UnannotatedWrite>& UnannotatedWrites();

// The arguments (indices into the schema's arguments) that a call of `op_name` with `arguments` (the schema's
// arguments, in order) writes without the schema saying so. Empty for almost every op.
std::vector<int> UnannotatedWritesOfCall(std::string_view op_base_name, const std::vector<c10::IValue>& arguments);

// Random ops without a Generator argument in any overload: they draw from their device's default generator.
bool IsGeneratorlessRandomOp(std::string_view op_base_name);

// Ops whose effect is more than their outputs (their namespace: collectives, profiler): never replayed.
bool HasExternalEffects(std::string_view op_base_name);

// Whether a call of `op_base_name` with `arguments` (the schema's, in order), an op that writes arguments it does not
// return, computes its outputs without those arguments' values: batch norm in training mode, rrelu's noise. Such
// a call is replayed with fresh memory in place of the written arguments (3 above); any other is not replayable
// (4). `_native_batch_norm_legit` in eval mode reads the running statistics its schema marks written: not such a
// call.
bool OutputsIgnoreSideWrites(std::string_view op_base_name, const std::vector<c10::IValue>& arguments);

// Ops whose output holds whatever the memory held (aten::empty, new_empty, set_, resize_): replaying one cannot
// reproduce bytes written into it later by code remat does not see (torch.tensor(data), numpy copies).
bool ProducesUninitializedMemory(std::string_view op_base_name);

// In-place ops that write every element of `self` without reading it (fill_, zero_, copy_, the random fills).
bool OverwritesSelf(std::string_view op_base_name);

}  // namespace remat::integration
