// Executor: what the engine calls to make things happen. The engine decides (what to run, recompute, evict); the
// executor does it. The simulator's executor advances nothing but placement (the engine owns the logical clock)
// and places outputs in an Arena over the virtual provider; the PyTorch integration's executor runs the recorded
// kernel again with the same inputs and moves the result into the same StorageImpl, and drops a storage's memory
// on eviction.
//
// Contract:
//   - Execute(engine, op, replay, fresh): op's inputs are resident and locked. `fresh` lists the output storages
//     that need memory now (in arena mode the executor must place them and report each address with
//     Engine::SetAddress; in counter mode the engine has already made room against the budget). Returns an error
//     (ResourceExhausted for memory) to abort the op.
//   - Replaying an in-place op (OutputSpec::in_place_of) must not write into its input: the executor copies the
//     input into the fresh output's memory and applies the op there (the input is the old value, still needed).
//   - Evict(engine, s): drop s's memory. Never fails; s is unlocked, resident and not constant.
//   - Paging (a later issue) will add Page/Unpage here; nothing else should change.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace remat {

class Engine;
using OpId = std::uint32_t;
using TensorId = std::uint32_t;

class Executor {
 public:
  virtual ~Executor() = default;
  virtual absl::Status Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) = 0;
  virtual void Evict(Engine& engine, std::uint32_t storage) = 0;
};

}  // namespace remat
