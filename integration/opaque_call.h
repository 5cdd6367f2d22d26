// Opaque calls: an op whose body runs between two calls instead of inside a kernel the hook dispatches.
//
// Code that runs kernels the hook cannot see into, reading and writing tensors through raw pointers: a graph
// torch.compile made (inductor's generated kernels; the ATen kernels it calls pass through the hook unrecorded).
// Recorded as one op, remat::compiled_graph(written, read, graph), with the given tensors as inputs, its outputs
// given at the end:
//   - Begin: the observer's BeforeOp makes every input resident (pages in, rematerializes) and locks it, so no raw
//     pointer the call takes can see evicted or moved memory; `written` are the inputs the call may write
//     (inductor's mutated inputs: batch norm's running statistics, an optimizer's state). They are treated like
//     any write to a constant (engine_bridge.h): written storages become constants, and what was computed from
//     their old bytes is pinned first. Until End, every op on this thread passes through unrecorded, as a
//     recorded op's nested calls do; its allocations come from remat's arena and may make room.
//   - End: the outputs the call produced. A replayable call's outputs are evictable like any op's: replaying the
//     record runs remat::compiled_graph's kernel, which the Python package registers (remat/_compile.py: it calls
//     the graph `graph` names again on the same inputs, with fresh copies of `snapshot` in place of the written
//     ones, so that a replay sees the values the call saw and writes nothing anyone else sees). A call is
//     replayable when `graph` >= 0, `snapshot` holds a copy of every written input (taken before the call), it is
//     not part of a backward pass, every input is a plain CPU tensor (a replay draws from a copy of the default CPU
//     generator's state at Begin, as the call did: inductor's dropout seeds) and, the bridge decides, paging is off
//     (engine_bridge.h, "Compiled graphs"). Otherwise its outputs are constants, counted against the budget and
//     pageable with page_constants.
//   - Failed: the call threw (the engine's locks are released; the exception propagates).
// A call that cannot be replayed keeps no strong reference to its inputs while it runs: a call that frees an input
// early (inductor's backward graphs clear their argument list) frees its memory as it would without remat. A
// replayable call keeps them (its record reads them in a replay; a forward graph's caller holds them anyway).
// Calls nest per thread (a stack). With no observer, the hook off on this thread, or inside a recorded op, Begin and
// End do nothing but keep the nesting. Under a Python dispatch mode the call is recorded (it runs on real tensors)
// and replayed without the mode.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace remat::integration {

void BeginOpaqueCall(const std::vector<at::Tensor>& written, const std::vector<at::Tensor>& read,
                     std::int64_t graph = -1, const std::vector<at::Tensor>& snapshot = {});
void EndOpaqueCall(const std::vector<at::Tensor>& outputs);
void OpaqueCallFailed() noexcept;
// The operator opaque calls are recorded as; its schema is registered by opaque_call.cc, its kernel by whoever can
// replay the calls (remat/_compile.py for torch.compile's graphs).
inline constexpr const char* kOpaqueCallOperator = "remat::compiled_graph";

}  // namespace remat::integration
