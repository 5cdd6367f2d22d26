// Rematerializer: runs an op, replaying on the way whatever its inputs need (engine.h, "Semantics"). Each op to run
// is a frame on an explicit work stack (no C++ recursion: a 100,000-op replay chain works): gather the op's inputs
// (lock the resident ones, page in the paged ones, push a child frame that replays the producer of an evicted one),
// wait for their page-ins, make room (counter mode), call Executor::Execute (the only caller), mark the outputs
// resident, unlock the inputs. A frame with no target tensor only gathers and locks an op's inputs (BeginOp: the
// caller runs the kernel). A failed run releases the locks its unfinished frames took and leaves the engine usable.
// Gathering late (EngineOptions::retry_gathering_late, a second try after running out of memory): a frame replays
// its evicted inputs first and locks its resident ones after, replaying any that were evicted meanwhile.
//
// It owns the frame stack, the locks its running frames hold, their scratch, and which op's kernel runs now (the
// defragmenter must not move that op's memory). The records it reads and writes, the pool, the stats and the other
// steps it needs (paging in, counter-mode room, the memory report) are the engine's, reached through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/engine.h"

namespace remat {

class Rematerializer {
 public:
  explicit Rematerializer(Engine& engine);

  // Runs `op` to produce tensor `target` (remat: a replay, its cost counts as replayed; else a first execution).
  absl::Status Run(TensorId target, OpId op, bool remat);
  // Gathers and locks `op`'s inputs only, replaying what they need; the caller then runs the kernel.
  absl::Status Gather(OpId op);

  // Some frame is running: frames hold ids (nothing may be recycled).
  bool busy() const { return !stack_.empty(); }
  // The only frame gathers the caller's op's inputs (no replay under way): the point to prefetch for the next ops.
  bool GatheringCallersOp() const;
  // The op whose kernel runs now (Engine::kNoKernel: none): a replay inside Execute, or the caller's op between
  // BeginOp and EndOp/AbortOp, which the engine sets.
  OpId running_kernel() const { return running_kernel_; }
  void set_running_kernel(OpId op) { running_kernel_ = op; }

  // Where a run stands, for the out-of-memory report: the op the caller runs (the bottom frame, or the running
  // kernel when no frame runs), and the innermost replay with the number of replays on the stack. When the bottom
  // frame is itself a replay (Engine::Rematerialize: a result asked back outside any op's inputs, such as one pinned
  // before a value it was computed from is overwritten), `op` is that result's producer and `bringing_back` is set.
  struct Where {
    OpId op = Engine::kNoKernel;
    OpId replaying = Engine::kNoKernel;  // none unless the top frame is a replay above the bottom one
    std::size_t replays = 0;
    bool bringing_back = false;
  };
  Where where() const;

 private:
  struct Frame {
    TensorId t;  // the tensor to (re)compute, or kNone: only gather and lock `op`'s inputs (Gather)
    OpId op;
    bool remat;
    std::uint8_t stage;
    std::uint32_t list_begin, list_end, next;
    std::uint32_t lock_begin = 0;  // this frame's entries in lock_log_
  };
  // Runs the frames on the stack until the one on top when it was called is done; on failure releases what they
  // locked and pops them.
  absl::Status RunFrames();
  // RunFrames for a frame pushed on an empty stack, then, if it ran out of memory and the options say so, once more
  // gathering late.
  absl::Status RunOutermost();
  absl::Status RunFramesFrom(std::size_t base);

  Engine& engine_;
  std::vector<Frame> stack_;
  // Per frame, the inputs to gather: those not defined when it started (gathering late, then the others).
  std::vector<TensorId> pending_;
  std::vector<StorageIndex> lock_log_;      // locks taken by running frames, released in bulk if a run fails
  std::vector<TensorId> resident_siblings_;  // outputs of the replayed op still resident (locked while it runs)
  std::vector<std::uint32_t> fresh_;        // the storages the executor fills (Executor::Execute)
  OpId running_kernel_ = Engine::kNoKernel;
  bool gather_late_ = false;  // frames replay their evicted inputs before locking their resident ones
  // Gathering late gives up past this many replays in all (EngineStats::rematerializations): a bound that is
  // kLateReplaysPerFirst times what the first try replayed, at least kLateReplaysMin.
  static constexpr std::int64_t kLateReplaysPerFirst = 4;
  static constexpr std::int64_t kLateReplaysMin = 256;
  std::int64_t late_replay_limit_ = 0;
};

}  // namespace remat
