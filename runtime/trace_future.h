// TraceFuture: what the rest of a trace will read, as the engine's FutureUses (remat-sim --foresight).
//
// A trace replayed whole is a recorded iteration replayed with perfect knowledge of what comes next: for a storage,
// the number of CALL/MUTATE instructions until one reads a name bound to it. With it the DTR family ranks by
// distance to the next use instead of time since the last one (StorageView::Staleness), which measures how much
// foresight from a previous iteration could give a plan mode (issue 21) before the runtime records iterations.
//
// The replay driver tells it each binding (Bind) and each CALL/MUTATE as it starts (Advance); storages are found
// through the engine (StorageOf), so views and in-place rebindings count for the storage they are bound to now.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "runtime/trace.h"

namespace remat {

class TraceFuture final : public FutureUses {
 public:
  // `bound`: the driver's name -> tensor table (-1: unbound), read at each query; both must outlive this.
  TraceFuture(const Trace& trace, const Engine& engine, const std::vector<std::int64_t>& bound);
  void Bind(TraceName name, TensorId tensor);
  void Advance() { ++position_; }  // the next CALL or MUTATE starts
  std::int64_t OpsUntilNextUse(StorageIndex s) const override;

 private:
  const Engine& engine_;
  const std::vector<std::int64_t>& bound_;
  std::vector<std::vector<std::int32_t>> reads_;  // per name: the positions of the CALL/MUTATEs reading it
  mutable std::vector<std::size_t> cursor_;        // per name: first entry of reads_ not yet passed
  mutable std::vector<std::vector<TraceName>> names_of_;  // per storage: names bound to it (some stale)
  std::int64_t position_ = -1;                     // the CALL/MUTATE running (0-based)
};

}  // namespace remat
