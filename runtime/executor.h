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
//   - Paging (second tier, EngineOptions::paging). The engine owns the link timeline (when a copy starts and ends,
//     which op waits for it); the executor moves the bytes. A copy may run asynchronously as long as the executor
//     orders it before any later use of the same memory (a copy stream and events on CUDA).
//       PageOut(engine, s): copy s's bytes to the second tier, then release s's device memory (as Evict does). s is
//         resident and unlocked (a constant: held only by its pin). The engine has checked the host budget. On
//         error nothing may be lost: s must still be resident with its bytes; the engine fails the running call.
//         NotFound: s's bytes are gone already (its last holder died before the engine heard of it): nothing to
//         copy; the engine drops s instead (Evict), as it would have once told of the death.
//       PageIn(engine, s): get device memory for paged s (arena mode: place it and report the address with
//         Engine::SetAddress, exactly as for Execute's fresh outputs; the allocation may call MakeRoom) and copy the
//         second-tier bytes back, byte-identical; then release the host copy. ResourceExhausted when no memory can
//         be made; the host copy must then be kept.
//       DropPaged(engine, s): the host copy of paged s is no longer needed (s was recomputed, or its last
//         reference died); release it.
//   - DropPinned(engine, s): pinned s died (Engine::FreeDead: no reference left and nothing can need it) and gives
//     its memory back. The simulator frees its block; on the PyTorch path the bridge evicts the StorageImpl itself
//     (EngineBridge::ReleaseIfDead), so the default does nothing.
//       PageInAhead(engine, s): PageIn for a prefetch (Engine::Prefetch, PrefetchAhead): the copy may still be
//         running when it returns, and nothing reads s until the engine calls WillRead(engine, s) (default: PageIn).
//       WillRead(engine, s): an op (or replay) that reads resident s is about to run: order it after s's page-in
//         copy if one may still be running (default: nothing). Called for every input of every op while paging is
//         on, so it must be cheap when there is nothing to wait for.
//     The defaults of PageOut and PageIn return Unimplemented: an executor that cannot page never loses data, and
//     an engine configured to page with it fails its call loudly instead.
//   - Relocate(engine, s, avoid) (arena mode, EngineOptions::relocate): move storage s's bytes to a free block of
//     the arena outside the address range `avoid` (the highest hole that holds them first, Placement::kTop, else
//     the best fit), without asking the arena's pressure handler, and report the new address with
//     Engine::SetAddress. Returns whether s moved; false when no hole outside `avoid` holds it (and by default:
//     an executor that cannot move memory). s is resident and not evictable now (a constant, a pinned result, or
//     locked by an op still gathering its inputs), and no running kernel reads or writes it. An error aborts the
//     engine's call.
//   - Slide(engine, s, to) (arena mode, compaction): move storage s's block to address `to` inside the range it
//     would free (Arena::Move: the hole next to it), move its bytes (the two ranges may overlap) and report the new
//     address with Engine::SetAddress. Returns whether s moved; false when the executor cannot move it (and by
//     default). s is resident and no running kernel reads or writes it (it may be evictable). An error aborts the
//     engine's call.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat {

class Engine;
using OpId = std::uint32_t;
using TensorId = std::uint32_t;

class Executor {
 public:
  virtual ~Executor() = default;
  virtual absl::Status Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) = 0;
  virtual void Evict(Engine& engine, std::uint32_t storage) = 0;
  virtual absl::Status PageOut(Engine& engine, std::uint32_t storage);
  virtual absl::Status PageIn(Engine& engine, std::uint32_t storage);
  virtual void DropPaged(Engine& engine, std::uint32_t storage);
  virtual void DropPinned(Engine&, std::uint32_t) {}
  virtual absl::Status PageInAhead(Engine& engine, std::uint32_t storage) { return PageIn(engine, storage); }
  virtual void WillRead(Engine&, std::uint32_t) {}
  struct AddressRange {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;  // exclusive
    bool Overlaps(std::uintptr_t address, std::size_t size) const { return address < end && address + size > begin; }
  };
  virtual absl::StatusOr<bool> Relocate(Engine& engine, std::uint32_t storage, AddressRange avoid);
  virtual absl::StatusOr<bool> Slide(Engine& engine, std::uint32_t storage, std::uintptr_t to);
};

}  // namespace remat
