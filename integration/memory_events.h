// Memory history: what happened to remat's memory, in order, for pictures of a run (issue 20): PyTorch memory_viz
// snapshots (remat.dump_snapshot), Chrome/Perfetto timelines (remat.trace) and memory-over-time plots.
//
// Off by default; MemoryHistoryEnabled() is one relaxed atomic load, the only cost every recording site pays when
// it is off. When on, every event takes one mutex and is appended to a ring of at most `max_entries` events (the
// oldest go first, as in torch.cuda.memory._record_memory_history); `dropped` counts them.
//
// What is recorded, and where:
//   kAlloc, kFree      a block of the CPU arena allocated / freed (cpu_allocator.cc), with its aligned size
//   kMove              a block moved inside the arena (compaction, relocation): address = from, extra = to
//   kOpBegin, kOpEnd   an op remat records (dispatch_hook.cc; extra 0) or a replay (torch_executor.cc; extra 1);
//                      `label` is the op's name
//   kEvict             remat dropped storage `extra`'s bytes while the program still refers to it (the free that
//                      follows carries a "remat: evict" context)
//   kRelease           the program let go of storage `extra`: its bytes are freed ("remat: free released"), and it
//                      stays recomputable for replays that need it
//   kRematerialize     a replay delivered storage `extra` again at `address`
//   kPageOut, kPageIn  storage `extra` copied to the second tier and its block freed / brought back at `address`
//   kDropPaged         the second tier's copy of storage `extra` (`size` bytes) released
//   kOutOfMemory       an allocation of `size` bytes failed for good; extra = free bytes in the arena then
// Every event carries its thread's context: the stack of labels (ops, replays, "remat: evict", ...) open on the
// thread when it happened, innermost last, interned (MemoryHistory::contexts). Labels and contexts are interned for
// the life of the process, so ids stay valid across restarts of the history.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::integration {

enum class MemoryEventKind : std::uint8_t {
  kAlloc,
  kFree,
  kMove,
  kOpBegin,
  kOpEnd,
  kEvict,
  kRelease,
  kRematerialize,
  kPageOut,
  kPageIn,
  kDropPaged,
  kOutOfMemory,
};

inline constexpr std::int16_t kHistoryCpu = -1;

struct MemoryEvent {
  std::int64_t time_ns = 0;  // steady clock, since the history started
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t extra = 0;   // per kind, see above
  std::uint32_t context = 0;
  std::uint32_t label = 0;   // kOpBegin / kOpEnd: the op's name; else 0 ("")
  std::uint32_t thread = 0;  // 0 for the first thread that recorded, 1 for the next, ...
  std::int16_t device = kHistoryCpu;  // whose memory: kHistoryCpu for the CPU arena, else the CUDA device index
  MemoryEventKind kind = MemoryEventKind::kAlloc;
};

struct MemoryHistory {
  std::vector<MemoryEvent> events;                 // oldest first
  std::vector<std::string> labels;                 // by id; labels[0] is ""
  std::vector<std::vector<std::uint32_t>> contexts;  // by id: label ids, outermost first; contexts[0] is empty
  std::uint64_t dropped = 0;                       // events that left the ring since the start
  bool enabled = false;
};

namespace memory_history_detail {
extern std::atomic<bool> g_enabled;
}

inline bool MemoryHistoryEnabled() { return memory_history_detail::g_enabled.load(std::memory_order_relaxed); }

// Clears the ring and starts recording (again) with room for `max_entries` events (at least 1).
void StartMemoryHistory(std::size_t max_entries);
// Stops recording; what was recorded stays until the next start.
void StopMemoryHistory();
// A copy of what was recorded (while recording or after).
MemoryHistory CopyMemoryHistory();

// Appends one event with the calling thread's context (always; callers test MemoryHistoryEnabled()).
void AppendMemoryEvent(MemoryEventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t extra,
                       std::int16_t device);

// Appends one event with the calling thread's context; nothing when the history is off (inline: the allocator and
// the hook call it on every allocation and op, and pay one relaxed load then).
inline void RecordMemoryEvent(MemoryEventKind kind, std::uint64_t address, std::uint64_t size,
                              std::uint64_t extra = 0, std::int16_t device = kHistoryCpu) {
  if (MemoryHistoryEnabled()) AppendMemoryEvent(kind, address, size, extra, device);
}

// A label open on this thread for the scope's life: everything recorded meanwhile carries it in its context. With
// `op` set, also records kOpBegin / kOpEnd around the scope (extra = `replay`). No effect when the history is off
// at construction.
class MemoryEventScope {
 public:
  MemoryEventScope(std::string_view label, bool op, bool replay = false) {
    if (MemoryHistoryEnabled()) Begin(label, op, replay);  // inline: the hook opens one for every recorded op
  }
  ~MemoryEventScope() {
    if (active_) End();
  }
  MemoryEventScope(const MemoryEventScope&) = delete;
  MemoryEventScope& operator=(const MemoryEventScope&) = delete;

 private:
  void Begin(std::string_view label, bool op, bool replay);
  void End();
  bool active_ = false;
  bool op_ = false;
  bool replay_ = false;
  std::uint32_t label_ = 0;
};

}  // namespace remat::integration
