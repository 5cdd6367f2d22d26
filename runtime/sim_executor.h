// SimExecutor: the executor used by trace replay. Running an op costs nothing here (the engine advances the logical
// clock by the op's recorded cost); in arena mode it places each fresh output in the arena (owner id = storage
// index + 1, costly ops' outputs at the low end and others at the high end when partitioning is on) and frees the
// block on eviction and when a pinned storage dies (DropPinned). In counter mode it does nothing at all. Paging moves no bytes here (the engine keeps the link
// timeline and the accounting): a page-out frees the block like an eviction, a page-in places the storage again like
// a fresh output of its producer.
#pragma once

#include <cstdint>
#include <vector>

#include "allocator/arena.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace remat {

class SimExecutor final : public Executor {
 public:
  // `arena` may be null (counter mode).
  SimExecutor(Arena* arena, bool cheap_tensor_partitioning) : arena_(arena), partition_(cheap_tensor_partitioning) {}
  absl::Status Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) override;
  void Evict(Engine& engine, std::uint32_t storage) override;
  absl::Status PageOut(Engine& engine, std::uint32_t storage) override;
  absl::Status PageIn(Engine& engine, std::uint32_t storage) override;
  void DropPaged(Engine&, std::uint32_t) override {}
  void DropPinned(Engine& engine, std::uint32_t storage) override;
  absl::StatusOr<bool> Relocate(Engine& engine, std::uint32_t storage, AddressRange avoid) override;
  absl::StatusOr<bool> Slide(Engine& engine, std::uint32_t storage, std::uintptr_t to) override;

  // For a driver that runs an op as the PyTorch path does (BeginOp, its kernel's allocations, EndOp: remat-sim's
  // product configuration), arena mode only. AllocateForKernel places an output of the running `op` before EndOp
  // registers it (no owner yet; all-or-nothing is the caller's: FreeBlock what it placed); Adopt makes storage s the
  // owner of the block at its address (an output EndOp registered, or bytes an in-place write took over).
  bool arena_mode() const { return arena_ != nullptr; }
  absl::StatusOr<std::uintptr_t> AllocateForKernel(Engine& engine, OpId op, std::int64_t bytes);
  void FreeBlock(std::uintptr_t address);
  void Adopt(Engine& engine, std::uint32_t storage);

  // Bytes so far, for timelines (remat-sim --timeline): evicted while the trace still refers to them, freed when
  // their last reference went (still recomputable), and delivered again by replays.
  struct Totals {
    std::int64_t evicted_bytes = 0;
    std::int64_t released_bytes = 0;
    std::int64_t rematerialized_bytes = 0;
  };
  const Totals& totals() const { return totals_; }

  // When set (not owned), every replayed op's id is appended to `log` as it runs (remat-sim's schedules, for the
  // offline planner's check of what a policy did).
  void set_replay_log(std::vector<std::int64_t>* log) { replay_log_ = log; }

 private:
  void Free(Engine& engine, std::uint32_t storage);
  // Costly ops' outputs low, others high, with cheap-tensor partitioning; all low without.
  Placement PlacementFor(const Engine& engine, OpId op) const;
  static absl::Status OutOfMemory(const Engine& engine, OpId op, const absl::Status& status);
  Arena* arena_;
  bool partition_;
  Totals totals_;
  std::vector<std::int64_t>* replay_log_ = nullptr;
};

}  // namespace remat
