// DeviceArena: one CUDA device's memory under a hard budget, with stream-ordered reuse (DESIGN.md, "allocator/"
// and "PyTorch integration": CUDA). Knows blocks and streams, not tensors or torch.
//
// Memory. One Arena over the cuda provider, created at the first allocation with a single cudaMalloc'd segment of
// exactly the budget (bytes, or a fraction of the device's total memory resolved then), or a stitching arena (see
// DeviceArenaKind) whose budget counts mapped physical granules. The budget is a hard limit: the arena never grows. EmptyCache gives the segment back to CUDA when no block is allocated (the Arena
// object, and any Arena* taken from arena(), dies with it); the next allocation reserves it again.
//
// Streams (what PyTorch users expect of the caching allocator). Each block belongs to the stream it was allocated
// on; RecordStream adds streams that use it. While only one stream has ever been seen, a freed block goes back to
// the arena at once: stream order alone makes reuse safe. From the first allocation or RecordStream on a second
// stream on, a freed block first gets an event recorded on each stream that used it and stays out of the arena
// ("pending") until all its events complete, so it is never handed to another stream while a recorded use may
// still be running. At that switch an event recorded on the first stream is made a dependency of every newly
// seen stream until it completes, which covers blocks freed earlier without events. Pending blocks return to the
// arena when an allocation finds their events complete; under pressure the allocator first takes back completed
// ones, then takes back the rest in the allocating stream's order, then asks the pressure handler (the runtime) to
// evict (and takes back what that freed the same way), then fails. "In the stream's order" means without the host
// waiting, as cudaMallocAsync pools reuse memory: the allocating stream waits on the device (cudaStreamWaitEvent)
// for each pending event recorded on another stream (a page-out's copy, say), and then records a handoff event that
// every other stream allocating afterwards waits for while it has not completed, since it may get one of those
// blocks. The host waits (EventSynchronize) only in EmptyCache, SetBudget and when the pressure comes from outside
// Allocate.
//
// Errors are values: Allocate fails with ResourceExhausted naming the device, the request, the budget, what is
// allocated and pending, the free bytes and the largest hole. Freeing an address that is not a live block is
// InvalidArgument. A CUDA error from the runtime is passed on.
//
// Thread safety: every method may be called from any thread. The pressure handler is called without this object's
// lock held and may Free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "allocator/cuda/cuda_runtime.h"
#include "allocator/cuda/cuda_stitch_provider.h"

namespace remat::cuda {

// Contiguous: one cudaMalloc'd segment of the budget. Stitch (issue 18): address space of 8 times the budget, backed
// granule by granule with physical memory (cuda_stitch_provider.h); the budget counts mapped granules, so a request
// needs enough free granules, not a hole. Used when the device supports virtual memory management; otherwise the
// arena is contiguous and DeviceArenaStats::stitch_fallback says why. Blocks of a stitched arena do not Move.
enum class DeviceArenaKind { kContiguous, kStitch };

struct DeviceArenaOptions {
  int device = 0;
  std::size_t budget = 0;        // bytes; when 0, `budget_fraction` of the device's total memory
  double budget_fraction = 0;    // in (0, 1]
  std::size_t alignment = 512;   // every block's address and size (CUDA's caching allocator uses 512 too)
  DeviceArenaKind kind = DeviceArenaKind::kContiguous;
  // Stitch only: bytes per granule, a power of two and a multiple of the device's granularity; 0 takes the device's
  // recommended granularity, at least kDefaultStitchGranule.
  std::size_t granule = 0;
};
inline constexpr std::size_t kDefaultStitchGranule = std::size_t{2} << 20;

// A statistic as PyTorch keeps it (c10::CachingAllocator::Stat): current value, peak since reset, and the
// running sums of increases and decreases.
struct StatCounter {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;
  void Increase(std::int64_t amount);
  void Decrease(std::int64_t amount);
};

struct DeviceArenaStats {
  std::size_t budget = 0;             // 0 while a fractional budget is still unresolved
  StatCounter allocation;             // blocks handed out
  StatCounter allocated_bytes;        // their aligned sizes
  StatCounter requested_bytes;        // their requested sizes
  StatCounter active;                 // allocated + pending blocks (memory not reusable yet)
  StatCounter active_bytes;
  StatCounter segment;                // reserved segments (0 or 1)
  StatCounter reserved_bytes;
  std::size_t pending_blocks = 0;
  std::size_t pending_bytes = 0;
  std::size_t free_bytes = 0;         // in the arena, free now
  std::size_t largest_free_block = 0;
  std::int64_t pressure_allocations = 0;  // allocations that needed the pressure path (num_alloc_retries)
  std::int64_t ooms = 0;
  std::int64_t synchronizations = 0;      // host waits for pending events (EmptyCache, or pressure outside Allocate)
  std::int64_t stream_ordered_reclaims = 0;  // pressure that took pending blocks back in the allocating stream's order
  std::int64_t device_mallocs = 0;
  std::int64_t device_frees = 0;
  std::int64_t move_bounces = 0;          // slides whose bytes went through pinned host memory (Move)
  bool multi_stream = false;
  // Stitching: whether the arena stitches, its granule, the bytes of granules mapped now and at the peak (what the
  // budget counts), the provider's counters; `stitch_fallback` says why a stitch arena asked for is contiguous.
  bool stitched = false;
  std::size_t granule = 0;
  std::size_t physical_bytes = 0;
  std::size_t peak_physical_bytes = 0;
  StitchCounters stitch;
  std::string stitch_fallback;
};

class DeviceArena {
 public:
  // Validates the options; reserves nothing. `runtime` is not owned and must outlive the arena.
  static absl::StatusOr<std::unique_ptr<DeviceArena>> Create(CudaRuntime* runtime, DeviceArenaOptions options);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // A block of `bytes` (0 counts as one alignment unit) for use on `stream`.
  absl::StatusOr<std::uintptr_t> Allocate(std::size_t bytes, cudaStream_t stream,
                                          Placement placement = Placement::kLow);
  // Same, but only what fits now: no pending frees are waited for and the pressure handler is not asked (the
  // runtime moving memory while it makes room). ResourceExhausted when nothing fits.
  absl::StatusOr<std::uintptr_t> TryAllocate(std::size_t bytes, cudaStream_t stream,
                                             Placement placement = Placement::kLow);
  // Slides the live block at `from` to `to` inside the range it would free (Arena::Move) and moves its bytes with
  // device-to-device copies on the block's stream (in chunks no longer than the distance, so that overlapping
  // ranges copy correctly), left to stream order (other streams allocating afterwards wait for them on the device,
  // a handoff); a slide that would take 64 or more such copies bounces its bytes through pinned host memory instead
  // (chunks of up to 64 MiB), and the host waits for those. FailedPrecondition for a block other streams use (record_stream);
  // the arena's InvalidArgument when `to` is out of range (nothing changes then). DataLoss when a copy fails: the
  // block lives at `to` from then on, but its bytes are not all there.
  absl::Status Move(std::uintptr_t from, std::uintptr_t to);
  // Reserves the budget's segment now (Allocate does it at the first request) and returns the arena.
  absl::StatusOr<Arena*> Reserve();
  // Stream-ordered: the memory is reused only after the recorded uses finish (see above).
  absl::Status Free(std::uintptr_t address);
  // `stream` also uses the block at `address` (torch's record_stream). The allocation stream is a no-op.
  absl::Status RecordStream(std::uintptr_t address, cudaStream_t stream);

  bool Owns(std::uintptr_t address) const;               // a live (allocated) block starts here
  absl::StatusOr<std::size_t> BlockSize(std::uintptr_t address) const;  // aligned size of a live block
  absl::StatusOr<cudaStream_t> BlockStream(std::uintptr_t address) const;
  // The segment holding `pointer` (any address inside it): torch's getBaseAllocation.
  absl::StatusOr<Segment> SegmentOf(std::uintptr_t pointer) const;

  // Returns completed pending blocks to the arena; with `synchronize`, waits for all of them. Returns how many.
  absl::StatusOr<std::size_t> ReclaimPending(bool synchronize);
  // Waits for pending frees, then releases the segment if nothing is allocated and no pressure handler is set (the
  // runtime holds on to the arena while it is attached).
  absl::Status EmptyCache();
  // Changes the budget; FailedPrecondition while any block is allocated or a pressure handler is set (the runtime
  // holds the arena). Releases the current segment.
  absl::Status SetBudget(std::size_t bytes);
  absl::Status SetBudgetFraction(double fraction);
  // The budget in bytes, resolving a fraction against the device's total memory.
  absl::StatusOr<std::size_t> Budget();
  // Largest request that can be served without eviction: the largest free block (stitched: at most the bytes of
  // granules not mapped), or the budget before the segment is reserved (torch's cacheInfo, which cuDNN uses to size
  // its workspace).
  std::size_t LargestFreeBlock();

  // The runtime's hook, called after pending frees are exhausted. nullptr: fail instead. Not owned. Its
  // DescribeMemory is added to the out-of-memory error.
  void SetPressureHandler(PressureHandler* handler);
  bool HasPressureHandler() const;
  // The arena (SetOwner, FindWindow for the runtime); nullptr before the first allocation and after EmptyCache
  // released the segment.
  Arena* arena();
  // Blocks in address order (for snapshots); empty when no segment is reserved.
  std::vector<BlockInfo> Blocks() const;

  DeviceArenaStats Stats() const;
  void ResetPeak();
  void ResetAccumulated();
  int device() const;

 private:
  struct State;
  explicit DeviceArena(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace remat::cuda
