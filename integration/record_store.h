// RecordStore: the op records the bridge keeps for replays (engine_bridge.h, "Pruning"). The records themselves
// (ReplayOp) live in the executor, which replays them; this part owns which ops have one, when to prune, and the
// emptied ReplayOps of dropped records, reused for later ones.
//
// Contract:
//   - Make(record) gives a ReplayOp holding `record` (a reused one when there is a spare: no allocation per kept op);
//     Keep(op) notes that the executor now keeps op's record (TorchExecutor::AddOp).
//   - DuePrune() is true once every kPruneEvery calls (one per op).
//   - DropInert(engine, executor, on_drop) takes out of the executor the record of every kept op the engine reports
//     inert (Engine::OpInert: nothing can replay it), calls on_drop(record) while its references are still held,
//     then lets them go at once (a storage's death is its use count; the TensorImpls of its aliases, without their
//     storages, go to the hook's spares: RecycleAliases) and keeps the emptied ReplayOp as a spare.
//     Dropped(op) then tells the ops it dropped, until ClearDropped().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "integration/torch_executor.h"
#include "runtime/engine.h"

namespace remat::integration {

class RecordStore {
 public:
  static constexpr std::int64_t kPruneEvery = 1024;

  std::unique_ptr<ReplayOp> Make(OpRecord&& record);
  void Keep(OpId op) { kept_.push_back(op); }
  bool DuePrune() {
    if (++ops_since_prune_ < kPruneEvery) return false;
    ops_since_prune_ = 0;
    return true;
  }
  // Returns how many records it dropped.
  template <typename OnDrop>
  std::size_t DropInert(const Engine& engine, TorchExecutor& executor, OnDrop on_drop);
  bool Dropped(OpId op) const { return op < dropped_.size() && dropped_[op] != 0; }
  void ClearDropped();
  std::size_t kept() const { return kept_.size(); }

 private:
  static constexpr std::size_t kMaxSpares = 1024;
  void Recycle(std::unique_ptr<ReplayOp> replay);

  std::vector<OpId> kept_;  // ops whose records the executor keeps
  std::int64_t ops_since_prune_ = 0;
  std::vector<std::unique_ptr<ReplayOp>> spares_;  // emptied: no reference left
  std::vector<std::uint8_t> dropped_;              // per op id: dropped by the last DropInert
  std::vector<OpId> dropped_ops_;                  // the ops marked in dropped_
};

template <typename OnDrop>
std::size_t RecordStore::DropInert(const Engine& engine, TorchExecutor& executor, OnDrop on_drop) {
  std::size_t kept = 0;
  std::size_t dropped = 0;
  for (const OpId op : kept_) {
    if (executor.Op(op) == nullptr) continue;
    if (!engine.OpInert(op)) {
      kept_[kept++] = op;
      continue;
    }
    std::unique_ptr<ReplayOp> replay = executor.TakeOp(op);
    on_drop(static_cast<const ReplayOp&>(*replay));
    if (op >= dropped_.size()) dropped_.resize(op + 1, 0);
    dropped_[op] = 1;
    dropped_ops_.push_back(op);
    Recycle(std::move(replay));
    ++dropped;
  }
  kept_.resize(kept);
  return dropped;
}

}  // namespace remat::integration
