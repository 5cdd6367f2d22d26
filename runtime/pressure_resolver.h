// PressureResolver: makes room when an allocation does not fit (engine.h, "Semantics"; runtime/README.md, "One
// allocation under pressure"). In the arena (MakeRoom, the arena's pressure handler), in order:
//   0. drop the storages released while an evicted storage's replay reads them (Engine::Release kept them
//      resident for as long as memory allowed; eager eviction would have dropped them at release);
//   1. compact first, when the free bytes hold the request but no hole does and a run joins by moving at most
//      EngineOptions::compact_first_limit times the request (not for window policies, not in a stitching arena);
//   2. the policy's victim from the pool (a window of blocks for window policies), dropped or paged (Pager::Reclaim);
//   3. when the pool has nothing: page the least recently used constant, relocate idle pinned blocks, compact a run
//      (runtime/defragmenter.h);
//   4. last, the deferred reserve (gradients, prefetched storages): released into the pool for one choice only.
// Against the budget in counter mode (MakeRoomCounter): step 0, then victims until the bytes fit, or
// ResourceExhausted naming what is locked and constant. Each step answers whether it made room, or why it failed
// (a page-out that could not write, a failed move): that error is returned as is, never kept aside.
//
// It owns the request it last gave up on (HoleForRetry), whether this allocation's pressure was sampled for the
// fragmentation figure, and the deferred storages released for one choice. Victim choice, the records, the pager
// and the defragmenter are the engine's, reached through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "runtime/engine.h"

namespace remat {

class PressureResolver {
 public:
  explicit PressureResolver(Engine& engine) : engine_(engine) {}

  // The arena cannot place `bytes`: true when room was made (the arena retries), false when nothing can, or the
  // error of a step that failed.
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes);
  // Counter mode: reclaims until `bytes` more fit in the budget; `what` names the op for the error.
  absl::Status MakeRoomCounter(std::int64_t bytes, std::string_view what);
  // After a kernel ran out: compacts with the op's inputs movable (Defragmenter::HoleForRetry) for the request
  // MakeRoom last gave up on; false when there is none. The request is forgotten once a hole is made (or the
  // compaction failed), or at the next MakeRoom; a caller further out (a composite op around the kernel) may ask
  // again after releasing what blocked it.
  absl::StatusOr<bool> MakeHoleForRetry();
  // A new allocation starts: the next pressure event samples the arena's free bytes (fragmentation).
  void NoteAllocation() { pressure_sampled_ = false; }

 private:
  absl::StatusOr<bool> MakeRoomOnce(Arena& arena, std::size_t bytes);
  // Puts the deferred storages (Engine::Defer) into the pool for one choice; true when the pool is no longer empty.
  // The caller chooses, then calls RedeferUnchosen, which takes the ones not chosen out again: one pressure event
  // that finds nothing else releases one victim, not every gradient at once.
  bool ReleaseDeferred();
  void RedeferUnchosen();

  Engine& engine_;
  bool pressure_sampled_ = false;
  std::size_t failed_request_ = 0;    // the last request MakeRoom gave up on (MakeHoleForRetry)
  std::vector<StorageIndex> released_;  // deferred storages in the pool for one choice (ReleaseDeferred)
};

}  // namespace remat
