// Defragmenter: the moves that make a hole when the arena's free bytes would hold a request but no single free
// block does (engine.h, "MakeRoom"; EngineOptions::relocate). Two moves:
//   - RelocateIdle: the resident storages the policy cannot evict (constants, pinned results, inputs locked by an op
//     still gathering the others) leave the run of blocks that needs the fewest such bytes moved, for holes
//     elsewhere (Executor::Relocate);
//   - Compact: the run between barriers whose free blocks hold the request with the fewest storage bytes inside
//     slides its storages together towards its start (Executor::Slide), joining its free blocks at its end.
// Never moved: a storage the running kernel reads or writes (its pointers are in use), one held (Engine::Hold), one
// fixed (its address is known outside the engine), one paged out or without an arena address.
//
// It owns no record: it reads the graph records and the pool, and asks the executor to move bytes; what moved is
// counted in the EngineStats it was given. Its own state is scratch kept for its capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "runtime/engine.h"
#include "runtime/eviction_pool.h"
#include "runtime/graph_records.h"

namespace remat {

class Defragmenter {
 public:
  // `engine` is what the executor's moves report new addresses to; every reference must outlive this.
  // `enabled` false (EngineOptions::relocate off): nothing ever moves.
  Defragmenter(const GraphRecords& records, const EvictionPool& pool, Engine& engine, EngineStats& stats,
               bool enabled)
      : records_(records), pool_(pool), engine_(engine), stats_(stats), enabled_(enabled) {}

  // Moves idle unevictable storages out of the cheapest window that can hold `bytes`; true when one moved. An
  // executor error is returned as is. `running_kernel`: the op whose kernel runs now (Engine::kNoKernel: none).
  absl::StatusOr<bool> RelocateIdle(Executor& executor, Arena& arena, std::size_t bytes, OpId running_kernel);
  // Compacts the cheapest run that can hold `bytes` if it moves at most `max_moved` bytes; true when one moved.
  absl::StatusOr<bool> Compact(Executor& executor, Arena& arena, std::size_t bytes, OpId running_kernel,
                               std::size_t max_moved = std::numeric_limits<std::size_t>::max());
  // For a kernel that ran out of `bytes` and will run again with its inputs free to move: gathers every free byte
  // into one hole if nothing stands in the way, else as many as the request needs. True when a free block now
  // holds `bytes`. A stitching arena has no holes to make (only eviction frees granules): false.
  absl::StatusOr<bool> HoleForRetry(Executor& executor, Arena& arena, std::size_t bytes);

 private:
  // Whether s is an input or an output of the op whose kernel runs now: its memory must not move.
  bool UsedByKernel(StorageIndex s, OpId kernel) const;

  const GraphRecords& records_;
  const EvictionPool& pool_;
  Engine& engine_;
  EngineStats& stats_;
  const bool enabled_;
  absl::flat_hash_map<std::uintptr_t, StorageIndex> movable_;  // scratch: the storages a move may take, by address
};

}  // namespace remat
