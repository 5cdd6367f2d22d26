// Arena: an address-aware allocator over segments from a MemoryProvider (DESIGN.md, "allocator/").
//
// Blocks tile each segment in address order; free blocks sit in a best-fit index (size, then address).
// Allocate rounds the request up to the alignment, picks the smallest free block that fits, and splits it,
// placing the new block at the low or the high end of that free block (Coop's cheap-tensor partitioning).
// Free coalesces with free neighbours, so two free blocks are never adjacent.
//
// Every allocated block carries an opaque 64-bit owner id that the caller sets and may change; the arena never
// interprets it. The runtime stores its storage id there, which lets a window search name the storages to evict.
//
// When a request cannot be placed, Allocate calls the pressure handler (without holding the arena's lock, so the
// handler may Free or Move), and retries while the handler reports progress. If the handler frees nothing (or
// there is none), Allocate fails with ResourceExhausted naming the request, the free bytes and the largest hole.
// Progress means the handler returned true and at least one Free or Move happened meanwhile. A request larger than
// every segment of a non-growing arena fails at once, without calling the handler. Two threads under pressure may
// run the handler concurrently.
//
// Thread safety: every public method may be called from any thread (autograd runs backward on its own thread).
// The callbacks passed to FindWindow and ForEachBlock run under the arena's lock. From inside them the same
// arena answers queries (Block, AdjacentFreeBytes, Stats, ForEachBlock) and SetOwner without locking again;
// Allocate, TryAllocate and Free fail with FailedPrecondition there, and a nested FindWindow returns nullopt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/memory_provider.h"

namespace remat {

using OwnerId = std::uint64_t;
inline constexpr OwnerId kNoOwner = 0;

// Where a new block goes. kLow / kHigh: the best-fitting free block (the smallest that holds it), at its low or
// high end. kTop: the free block with the highest address that holds it, at its high end (slower: it looks at
// every free block large enough; for moving long-lived blocks out of the way, not for every allocation).
enum class Placement { kLow, kHigh, kTop };

struct ArenaOptions {
  // Bytes reserved from the provider up front, in one segment. 0 reserves nothing until the first allocation.
  std::size_t capacity = 0;
  // Every block's address and size are multiples of this (512 like CUDA's allocator, 64 for CPU tensors).
  std::size_t alignment = 512;
  // When true, a request that does not fit reserves another segment (at least the request) instead of failing,
  // up to `growth_limit` bytes reserved in total (0: no limit). New segments are at least 2 MiB and at least
  // `capacity`. The remat budget is a hard limit, so the runtime leaves it off.
  bool grow = false;
  std::size_t growth_limit = 0;
  // Stitching (issue 18), when `granule` > 0 (a power of two, a multiple of `alignment`): the arena's address
  // space is larger than its memory, and only granules that allocated blocks overlap hold memory (provider Map and
  // Unmap, allocator/granule_map.h). At most `physical_limit` bytes of granules are mapped at once: that, not the
  // address space, is the budget. An allocation that would map more calls the pressure handler; evicting any block
  // whose granules nothing else uses gives them back, wherever it lies, so a request needs enough free granules,
  // not a hole. Blocks cannot Move (their granules would be unmapped before the caller copies them).
  std::size_t granule = 0;
  std::size_t physical_limit = 0;
};

struct ArenaStats {
  std::size_t allocated_bytes = 0;       // bytes in allocated blocks (aligned sizes)
  std::size_t reserved_bytes = 0;        // bytes in all segments
  std::size_t peak_allocated_bytes = 0;  // since creation or ResetPeak()
  std::size_t free_blocks = 0;
  std::size_t free_bytes = 0;
  std::size_t largest_free_block = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t moves = 0;                 // Move calls that moved a block
  std::uint64_t pressure_allocations = 0;  // Allocate calls that called the pressure handler (even if they failed)
  std::uint64_t search_ns = 0;             // time in best-fit lookups (sampled 1 in 16, scaled) and window searches
  // Stitching only (else 0): bytes of mapped granules now and at the peak, the physical limit, the granule.
  std::size_t physical_bytes = 0;
  std::size_t peak_physical_bytes = 0;
  std::size_t physical_limit = 0;
  std::size_t granule = 0;
};

// One block as seen from outside, for reports, tests and window searches.
struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  OwnerId owner = kNoOwner;
  bool free = true;
};

// A contiguous run of blocks that, once its allocated blocks are evicted, holds the request.
struct Window {
  std::uintptr_t address = 0;
  std::size_t size = 0;            // sum of the run's block sizes
  double cost = 0;                 // sum of the allocated blocks' costs
  std::vector<OwnerId> owners;     // owners of the allocated blocks in the run, in address order
};

class Arena;

class PressureHandler {
 public:
  virtual ~PressureHandler() = default;
  // `bytes` (aligned) could not be placed. Free memory (Arena::Free) and return true if anything was freed;
  // false gives up and fails the allocation (ResourceExhausted). An error is a failure to make room that is not a
  // lack of memory (a page-out that could not write its copy): the allocation fails with it, its code and message.
  virtual absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) = 0;
  // After MakeRoom gave up: what holds the memory it could not free (locked, constant, pinned bytes), for the
  // out-of-memory error. Called without the arena's lock held; empty when the handler has nothing to say.
  virtual std::string DescribeMemory() { return {}; }
};

class Arena {
 public:
  static absl::StatusOr<std::unique_ptr<Arena>> Create(std::unique_ptr<MemoryProvider> provider,
                                                      ArenaOptions options);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Places `bytes` (rounded up to the alignment; 0 counts as one alignment unit) for `owner`. Calls the pressure
  // handler when nothing fits.
  absl::StatusOr<std::uintptr_t> Allocate(std::size_t bytes, OwnerId owner, Placement placement = Placement::kLow);
  // Same, but never calls the pressure handler.
  absl::StatusOr<std::uintptr_t> TryAllocate(std::size_t bytes, OwnerId owner,
                                             Placement placement = Placement::kLow);
  // `address` must be the start of an allocated block; anything else is InvalidArgument.
  absl::Status Free(std::uintptr_t address);
  absl::Status SetOwner(std::uintptr_t address, OwnerId owner);
  // Moves the allocated block at `from` to `to`, keeping its size and owner, when [to, to + size) lies inside the
  // range the block would free (the block and its free neighbours): sliding it into the hole below or above it.
  // Only the block list changes; the bytes are the caller's to move (the old and new ranges may overlap:
  // memmove). InvalidArgument when `from` is not an allocated block or `to` is misaligned or out of that range.
  absl::Status Move(std::uintptr_t from, std::uintptr_t to);
  // The block that starts at `address`, allocated (one hash probe) or free (a walk of its segment); NotFound
  // for any other address.
  absl::StatusOr<BlockInfo> Block(std::uintptr_t address) const;

  // Cost of one allocated block for a window search: a value, or nullopt for a barrier (locked, constant, not
  // evictable) that no window may contain.
  using BlockCost = absl::FunctionRef<std::optional<double>(const BlockInfo&)>;
  // The contiguous run of free and non-barrier blocks, inside one segment, with total size >= `bytes` (aligned)
  // and the smallest summed cost (free blocks cost 0; sums are taken in address order). Ties go to the run that
  // ends at the lowest address, and the run is as short as possible (it starts at the highest block that still
  // leaves it >= `bytes`). Costs should be >= 0: negative costs count as 0, NaN and infinity as barriers. nullopt
  // when no run holds the request. One two-pointer pass, O(blocks); `cost` is called at most once per allocated
  // block.
  std::optional<Window> FindWindow(std::size_t bytes, BlockCost cost) const;
  // Free bytes immediately below and above the allocated block at `address` (the DTE heuristic's size term);
  // 0 when `address` is not the start of an allocated block.
  std::size_t AdjacentFreeBytes(std::uintptr_t address) const;

  // Replaces the pressure handler and returns once no call into the old one is in flight (Allocate calls it
  // without the arena's lock), so the old handler may then be destroyed. Must not be called from inside a handler
  // call on the same arena.
  void SetPressureHandler(PressureHandler* handler);
  ArenaStats Stats() const;
  // Stats().peak_allocated_bytes alone, without walking the free index (the engine reads it after every op).
  std::size_t PeakAllocatedBytes() const;
  // The peak of what the budget counts: peak_physical_bytes when stitching, else peak_allocated_bytes.
  std::size_t PeakBudgetedBytes() const;
  // Whether the arena stitches (ArenaOptions::granule > 0).
  bool stitched() const;
  void ResetPeak();
  // Visits every block of every segment in address order.
  void ForEachBlock(const std::function<void(const BlockInfo&)>& visit) const;
  std::size_t alignment() const;
  const MemoryProvider& provider() const;

 private:
  struct State;
  explicit Arena(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace remat
