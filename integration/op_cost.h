// Estimated op cost: a deterministic stand-in for an op's measured time (DESIGN.md: "the clock advances by each
// op's cost (measured time in PyTorch)").
//
// Measured times make eviction choices, and with them the arena's layout, vary from run to run; a budget near the
// edge then passes in some runs and fails in others. With estimated costs the same program makes the same
// choices every time (tests, reproducible experiments). The estimate is a roofline-style sum in nanoseconds:
// a fixed dispatch cost, the bytes the op reads and writes at 10 GB/s, and for the ops that dominate training
// (mm, addmm, bmm, baddbmm, convolution and their backward) their multiply-adds at 20 GFLOP/s. Only relative
// costs matter to the policies.
#pragma once

#include <cstdint>

#include "integration/dispatch_hook.h"

namespace remat::integration {

// Of a record whose outputs are captured (after the op ran).
std::int64_t EstimatedCostNs(const OpRecord& record);

}  // namespace remat::integration
