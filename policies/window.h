// Address-aware heuristics (arena mode).
//
//   dte   MegEngine/OneFlow DTE: (c + eq-class neighbourhood) / ((m + adjacent free bytes) * staleness).
//         Evicting next to a hole frees a larger contiguous run, so it pays more. In counter mode the
//         adjacent free bytes are 0 and it behaves like dtr-eq.
//   coop  Coop (Zhang et al., NeurIPS 2023): the engine asks the arena for the cheapest contiguous window of free
//         and evictable blocks; a block's cost is (c + evicted direct neighbours' c) / staleness (no size term).
//         Outside arena mode (no windows), it evicts the single storage with the smallest such cost.
#pragma once

#include <memory>

#include "policies/costly_ops.h"
#include "policies/policy.h"

namespace remat {

std::unique_ptr<Policy> MakeDtePolicy();
std::unique_ptr<Policy> MakeCoopPolicy();

// Coop's cheap-tensor partitioning puts the outputs of costly ops (policies/costly_ops.h) at the low end of a free
// block and all others at the high end.

}  // namespace remat
