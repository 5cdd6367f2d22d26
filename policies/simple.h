// Cost-blind ablation heuristics from the DTR paper.
//
//   lru      oldest last access first (score = last access)
//   largest  largest storage first (score = 1 / bytes; infinity for 0 bytes)
//   random   uniformly random candidate, from the engine's seeded RNG (reproducible per seed)
#pragma once

#include <memory>

#include "policies/policy.h"

namespace remat {

std::unique_ptr<Policy> MakeLruPolicy();
std::unique_ptr<Policy> MakeLargestPolicy();
std::unique_ptr<Policy> MakeRandomPolicy();

}  // namespace remat
