// DeviceArena: see device_arena.h for the contract. About 880 lines on purpose: the stream-ordered bookkeeping below
// (live and pending blocks, events, the single-to-multi-stream barrier, handoffs of blocks taken back in one stream's
// order, bounce buffers freed after their events) is one state under one lock; the stitching provider's own logic
// lives in cuda_stitch_provider.cc, only its choice and statistics are here. If it grows again, the slide (Move,
// CopyForMoveLocked, the bounce buffers) is the part to move out, with State in an internal header.
//
// State under one mutex: live blocks (address -> size, requested size, stream, recorded streams), pending blocks
// (freed, waiting for their events), the streams seen, the single-to-multi-stream barrier event, a pool of
// reusable events and the statistics. The arena itself has its own lock; it is called under ours only for Free
// (which never calls back), and without ours for Allocate (which may call the pressure handler, which takes ours).
// `inflight` counts Allocate calls running without our lock, so EmptyCache never drops an arena in use.
#include "allocator/cuda/device_arena.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "allocator/cuda/cuda_provider.h"
#include "allocator/cuda/cuda_stitch_provider.h"
#include "allocator/request_above_budget.h"

namespace remat::cuda {

void StatCounter::Increase(std::int64_t amount) {
  current += amount;
  peak = std::max(peak, current);
  allocated += amount;
}

void StatCounter::Decrease(std::int64_t amount) {
  current -= amount;
  freed += amount;
}

namespace {

constexpr std::size_t kMaxMoveChunks = 64;
constexpr std::size_t kMoveBounceBytes = std::size_t{64} << 20;

struct LiveBlock {
  std::size_t size = 0;
  std::size_t requested = 0;
  cudaStream_t stream = nullptr;
  std::vector<cudaStream_t> uses;  // recorded streams other than `stream`
};

struct PendingBlock {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::vector<cudaEvent_t> events;
  std::vector<cudaStream_t> streams;  // per event: the stream it was recorded on
};

// Blocks handed back to the arena in the order of one stream (ReclaimForStreamLocked): that stream waited for their
// events on the device; any other stream that allocates waits for `event`, recorded on it after those waits.
struct Handoff {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
};

// The stream the calling thread's Allocate is for, while the arena may call MakeRoom (nullptr outside Allocate).
thread_local const cudaStream_t* t_allocating_stream = nullptr;

}  // namespace

struct DeviceArena::State {
  class Reclaimer final : public PressureHandler {
   public:
    explicit Reclaimer(State* state) : state_(state) {}
    absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) override { return state_->MakeRoom(arena, bytes); }
    std::string DescribeMemory() override {
      PressureHandler* user = state_->handler.load(std::memory_order_acquire);
      return user == nullptr ? std::string() : user->DescribeMemory();
    }

   private:
    State* state_;
  };

  CudaRuntime* runtime = nullptr;
  DeviceArenaOptions options;
  Reclaimer reclaimer{this};

  mutable std::mutex mu;
  std::shared_ptr<Arena> arena;                      // null until reserved
  std::size_t resolved_budget = 0;                   // 0 until resolved
  std::size_t segment_base = 0;
  std::size_t segment_size = 0;
  int inflight = 0;
  absl::flat_hash_map<std::uintptr_t, LiveBlock> live;
  std::vector<PendingBlock> pending;
  std::size_t pending_bytes = 0;
  absl::flat_hash_set<cudaStream_t> streams_seen;
  bool multi_stream = false;
  cudaEvent_t barrier = nullptr;                     // recorded on the first stream at the switch
  std::vector<cudaEvent_t> free_events;
  std::vector<Handoff> handoffs;
  std::vector<std::pair<void*, cudaEvent_t>> bounce_frees;  // pinned bounce buffers freed once their event completes
  std::atomic<PressureHandler*> handler{nullptr};
  DeviceArenaStats stats;                            // counters only; the rest is filled in by Stats()
  std::uint64_t retired_pressure = 0;                // pressure_allocations of arenas already released
  CudaStitchProvider* stitch_provider = nullptr;     // the arena's provider when it stitches (owned by the arena)
  std::string stitch_fallback;                       // why a stitch arena asked for is contiguous
  StitchCounters retired_stitch;                     // the counters of the last stitch provider released

  ~State() {
    std::lock_guard<std::mutex> lock(mu);
    (void)ReclaimLocked(/*synchronize=*/true);
    ScopedDevice device(runtime, options.device);
    if (barrier != nullptr) (void)runtime->EventDestroy(barrier);
    for (const Handoff& handoff : handoffs) (void)runtime->EventDestroy(handoff.event);
    (void)FreeBouncesLocked(/*synchronize=*/true);
    for (cudaEvent_t event : free_events) (void)runtime->EventDestroy(event);
    arena.reset();  // releases the segment (tensors still pointing into it are the caller's bug)
  }

  absl::StatusOr<std::size_t> ResolveBudgetLocked() {
    if (resolved_budget != 0) return resolved_budget;
    std::size_t bytes = options.budget;
    if (bytes == 0) {
      ScopedDevice device(runtime, options.device);
      if (!device.status().ok()) return device.status();
      absl::StatusOr<DeviceMemoryInfo> info = runtime->MemGetInfo();
      if (!info.ok()) return info.status();
      bytes = static_cast<std::size_t>(static_cast<double>(info->total) * options.budget_fraction);
    }
    bytes &= ~(options.alignment - 1);
    if (bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat("remat: the CUDA budget of device ", options.device,
                                                     " comes out at 0 bytes"));
    }
    resolved_budget = bytes;
    return bytes;
  }

  absl::Status EnsureArenaLocked() {
    if (arena != nullptr) return absl::OkStatus();
    absl::StatusOr<std::size_t> budget = ResolveBudgetLocked();
    if (!budget.ok()) return budget.status();
    ArenaOptions arena_options;
    arena_options.capacity = *budget;
    arena_options.alignment = options.alignment;
    arena_options.grow = false;
    std::unique_ptr<MemoryProvider> provider;
    absl::StatusOr<std::unique_ptr<CudaStitchProvider>> stitching = MakeStitchProviderLocked(*budget);
    if (!stitching.ok()) return stitching.status();
    stitch_provider = stitching->get();
    if (stitch_provider != nullptr) {
      const std::size_t granule = stitch_provider->granule();
      arena_options.granule = granule;
      arena_options.physical_limit = *budget / granule * granule;
      arena_options.capacity = 8 * arena_options.physical_limit;  // address space to spare costs nothing
      provider = std::move(*stitching);
    } else {
      provider = MakeCudaDeviceProvider(runtime, options.device);
    }
    absl::StatusOr<std::unique_ptr<Arena>> created = Arena::Create(std::move(provider), arena_options);
    if (!created.ok()) {
      stitch_provider = nullptr;
      return absl::Status(created.status().code(),
                          absl::StrCat("remat: cannot reserve the CUDA budget of ", *budget, " bytes on device ",
                                       options.device, ": ", created.status().message()));
    }
    arena = std::shared_ptr<Arena>(std::move(*created));
    arena->SetPressureHandler(&reclaimer);
    segment_base = 0;
    segment_size = 0;
    arena->ForEachBlock([&](const BlockInfo& block) {
      if (segment_size == 0) segment_base = block.address;
      segment_size += block.size;
    });
    stats.segment.Increase(1);
    stats.reserved_bytes.Increase(static_cast<std::int64_t>(ReservedBytesLocked()));
    ++stats.device_mallocs;
    return absl::OkStatus();
  }

  // For a stitch arena on a device that supports it, the provider; nullptr for a contiguous arena (asked for, or the
  // fallback, with the reason in stitch_fallback). An error for a granule or budget that cannot stitch.
  absl::StatusOr<std::unique_ptr<CudaStitchProvider>> MakeStitchProviderLocked(std::size_t budget) {
    if (options.kind != DeviceArenaKind::kStitch) return std::unique_ptr<CudaStitchProvider>();
    absl::StatusOr<VirtualMemorySupport> support = runtime->VirtualMemory(options.device);
    if (!support.ok()) return support.status();
    if (!support->supported) {
      stitch_fallback = absl::StrCat("CUDA device ", options.device,
                                     " does not support virtual memory management: the arena is contiguous");
      return std::unique_ptr<CudaStitchProvider>();
    }
    const std::size_t granule =
        options.granule != 0 ? options.granule : std::max(support->granularity, kDefaultStitchGranule);
    absl::StatusOr<std::unique_ptr<CudaStitchProvider>> made =
        MakeCudaStitchProvider(runtime, options.device, budget, granule);
    if (!made.ok()) {
      return absl::Status(made.status().code(), absl::StrCat("remat: cannot stitch the CUDA budget of ", budget,
                                                             " bytes on device ", options.device, ": ",
                                                             made.status().message()));
    }
    return made;
  }

  // What torch reports as reserved: the segment, or the most a stitch arena may map (its physical budget).
  std::size_t ReservedBytesLocked() const {
    return stitch_provider != nullptr ? arena->Stats().physical_limit : segment_size;
  }

  void ReleaseArenaLocked() {
    if (arena == nullptr) return;
    retired_pressure += arena->Stats().pressure_allocations;
    const std::size_t reserved = ReservedBytesLocked();
    if (stitch_provider != nullptr) retired_stitch = stitch_provider->counters();
    stitch_provider = nullptr;
    {
      ScopedDevice device(runtime, options.device);
      arena.reset();
    }
    stats.segment.Decrease(1);
    stats.reserved_bytes.Decrease(static_cast<std::int64_t>(reserved));
    ++stats.device_frees;
    segment_base = 0;
    segment_size = 0;
  }

  absl::StatusOr<cudaEvent_t> TakeEventLocked() {
    if (!free_events.empty()) {
      cudaEvent_t event = free_events.back();
      free_events.pop_back();
      return event;
    }
    return runtime->EventCreate();
  }

  // First sighting of `stream`: after the first stream, switch to multi-stream mode (see the header).
  absl::Status NoteStreamLocked(cudaStream_t stream) {
    if (streams_seen.contains(stream)) return absl::OkStatus();
    if (streams_seen.empty()) {
      streams_seen.insert(stream);
      return absl::OkStatus();
    }
    ScopedDevice device(runtime, options.device);
    if (!device.status().ok()) return device.status();
    if (!multi_stream) {
      const cudaStream_t first = *streams_seen.begin();
      absl::StatusOr<cudaEvent_t> event = runtime->EventCreate();
      if (!event.ok()) return event.status();
      absl::Status recorded = runtime->EventRecord(*event, first);
      if (!recorded.ok()) {
        (void)runtime->EventDestroy(*event);
        return recorded;
      }
      barrier = *event;
      multi_stream = true;
    }
    if (barrier != nullptr) {
      absl::StatusOr<bool> done = runtime->EventQuery(barrier);
      if (!done.ok()) return done.status();
      if (*done) {
        (void)runtime->EventDestroy(barrier);
        barrier = nullptr;
      } else {
        absl::Status waited = runtime->StreamWaitEvent(stream, barrier);
        if (!waited.ok()) return waited;
      }
    }
    streams_seen.insert(stream);
    return absl::OkStatus();
  }

  // A block the arena just placed for `stream`: live, and counted.
  void AddLiveLocked(Arena& from, std::uintptr_t address, std::size_t bytes, cudaStream_t stream) {
    absl::StatusOr<BlockInfo> block = from.Block(address);
    const std::size_t size = block.ok() ? block->size : bytes;
    live[address] = LiveBlock{size, bytes, stream, {}};
    stats.allocation.Increase(1);
    stats.allocated_bytes.Increase(static_cast<std::int64_t>(size));
    stats.requested_bytes.Increase(static_cast<std::int64_t>(bytes));
    stats.active.Increase(1);
    stats.active_bytes.Increase(static_cast<std::int64_t>(size));
  }

  void ReturnToArenaLocked(std::uintptr_t address, std::size_t size) {
    const absl::Status status = arena->Free(address);
    (void)status;  // cannot fail: the address is a live block of this arena by construction
    stats.active.Decrease(1);
    stats.active_bytes.Decrease(static_cast<std::int64_t>(size));
  }

  // Copies `size` bytes from `from` to `to` (the ranges may overlap) on `stream` and waits for them. Copying in the
  // direction of the move, chunk by chunk, reads every chunk before a later one overwrites it, and a chunk no longer
  // than the distance never overlaps its own source. A short slide of a large block would take size / distance
  // device-to-device copies, so past kMaxMoveChunks the bytes bounce through pinned host memory instead, in chunks
  // of up to kMoveBounceBytes (a chunk is read whole before it is written back).
  absl::Status CopyForMoveLocked(std::uintptr_t from, std::uintptr_t to, std::size_t size, cudaStream_t stream) {
    const std::size_t distance = from > to ? from - to : to - from;
    const bool bounce = size / distance >= kMaxMoveChunks;
    const std::size_t chunk_limit = bounce ? std::min(size, kMoveBounceBytes) : distance;
    void* host = nullptr;
    if (bounce) {
      absl::StatusOr<void*> pinned = runtime->HostAllocPinned(chunk_limit);
      if (!pinned.ok()) return pinned.status();
      host = *pinned;
      ++stats.move_bounces;
    }
    absl::Status copied = absl::OkStatus();
    for (std::size_t done = 0; copied.ok() && done < size;) {
      const std::size_t chunk = std::min(chunk_limit, size - done);
      const std::size_t offset = from > to ? done : size - done - chunk;
      auto* dst = reinterpret_cast<void*>(to + offset);
      const auto* src = reinterpret_cast<const void*>(from + offset);
      if (!bounce) {
        copied = runtime->MemcpyAsync(dst, src, chunk, CopyKind::kDeviceToDevice, stream);
      } else {
        copied = runtime->MemcpyAsync(host, src, chunk, CopyKind::kDeviceToHost, stream);
        if (copied.ok()) copied = runtime->MemcpyAsync(dst, host, chunk, CopyKind::kHostToDevice, stream);
      }
      done += chunk;
    }
    // The range the block left goes back to the arena now: in one stream's mode stream order protects it; with
    // several streams, the others wait for the copies on the device (a handoff) before they may reuse it.
    if (copied.ok() && multi_stream) copied = HandOffLocked(stream);
    if (host != nullptr) {
      // The bounce buffer goes once the copies through it have run (an event), or at once after a failed copy.
      absl::StatusOr<cudaEvent_t> event = copied.ok() ? TakeEventLocked() : absl::StatusOr<cudaEvent_t>(copied);
      absl::Status recorded = event.ok() ? runtime->EventRecord(*event, stream) : event.status();
      if (recorded.ok()) {
        bounce_frees.emplace_back(host, *event);
      } else {
        if (event.ok()) free_events.push_back(*event);
        (void)runtime->StreamSynchronize(stream);
        const absl::Status freed = runtime->HostFreePinned(host);
        if (copied.ok()) copied = freed;
      }
    }
    return copied;
  }

  // A budget changes only on an empty device: waits for pending frees, then gives the segment back.
  absl::Status ReleaseForBudgetChangeLocked() {
    // The runtime attached as pressure handler holds the arena (its engine keeps the address): it stays.
    if (handler.load(std::memory_order_acquire) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "remat: the CUDA budget of device ", options.device,
          " cannot change while the remat engine runs on it (its arena is in use); disable the engine first"));
    }
    (void)ReclaimLocked(/*synchronize=*/true);
    if (!live.empty() || !pending.empty() || inflight != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "remat: the CUDA budget of device ", options.device, " can only change while nothing is allocated (",
          live.size(), " blocks, ", stats.allocated_bytes.current, " bytes are)"));
    }
    ReleaseArenaLocked();
    return absl::OkStatus();
  }

  // A pending block whose uses are over (or ordered before the next user): back to the arena, its events reusable.
  void ReturnPendingLocked(const PendingBlock& block) {
    for (cudaEvent_t event : block.events) free_events.push_back(event);
    ReturnToArenaLocked(block.address, block.size);
    pending_bytes -= block.size;
  }

  absl::StatusOr<std::size_t> ReclaimLocked(bool synchronize) {
    if (pending.empty()) return std::size_t{0};
    ScopedDevice device(runtime, options.device);
    if (!device.status().ok()) return device.status();
    if (synchronize) ++stats.synchronizations;
    std::size_t reclaimed = 0;
    absl::Status first_error;
    std::vector<PendingBlock> still;
    for (PendingBlock& block : pending) {
      bool done = true;
      for (cudaEvent_t event : block.events) {
        absl::Status status;
        if (synchronize) {
          status = runtime->EventSynchronize(event);
        } else {
          absl::StatusOr<bool> query = runtime->EventQuery(event);
          status = query.status();
          if (query.ok() && !*query) done = false;
        }
        if (!status.ok()) {
          if (first_error.ok()) first_error = status;
          done = false;
        }
        if (!done) break;
      }
      if (!done) {
        still.push_back(std::move(block));
        continue;
      }
      ReturnPendingLocked(block);
      ++reclaimed;
    }
    pending = std::move(still);
    if (reclaimed == 0 && !first_error.ok()) return first_error;
    return reclaimed;
  }

  // Every pending block back to the arena for an allocation on `stream`, without the host waiting: `stream` waits
  // (cudaStreamWaitEvent) for each event recorded on another stream; events on `stream` itself are behind it in
  // stream order already. Other streams that allocate afterwards wait for a handoff event (OrderAfterHandoffsLocked).
  absl::StatusOr<std::size_t> ReclaimForStreamLocked(cudaStream_t stream) {
    if (pending.empty()) return std::size_t{0};
    ScopedDevice device(runtime, options.device);
    if (!device.status().ok()) return device.status();
    std::size_t reclaimed = 0;
    absl::Status error;
    std::vector<PendingBlock> still;
    for (PendingBlock& block : pending) {
      absl::Status status;
      for (std::size_t i = 0; i < block.events.size() && status.ok(); ++i) {
        if (block.streams[i] != stream) status = runtime->StreamWaitEvent(stream, block.events[i]);
      }
      if (!status.ok()) {
        if (error.ok()) error = status;
        still.push_back(std::move(block));
        continue;
      }
      ReturnPendingLocked(block);
      ++reclaimed;
    }
    pending = std::move(still);
    if (reclaimed > 0) {
      ++stats.stream_ordered_reclaims;
      (void)HandOffLocked(stream);
    }
    if (reclaimed == 0 && !error.ok()) return error;
    return reclaimed;
  }

  // Frees the bounce buffers whose copies have run (with `synchronize`, waits for all of them first).
  absl::Status FreeBouncesLocked(bool synchronize) {
    absl::Status status;
    std::vector<std::pair<void*, cudaEvent_t>> still;
    for (const auto& [host, event] : bounce_frees) {
      bool done = true;
      if (synchronize) {
        (void)runtime->EventSynchronize(event);
      } else {
        absl::StatusOr<bool> query = runtime->EventQuery(event);
        done = query.ok() && *query;
      }
      if (!done) {
        still.emplace_back(host, event);
        continue;
      }
      free_events.push_back(event);
      if (absl::Status freed = runtime->HostFreePinned(host); !freed.ok() && status.ok()) status = freed;
    }
    bounce_frees = std::move(still);
    return status;
  }

  // Memory given back to the arena in `stream`'s order: other streams that allocate wait for what `stream` queued so
  // far (OrderAfterHandoffsLocked). Without an event the host waits for `stream` instead.
  absl::Status HandOffLocked(cudaStream_t stream) {
    absl::StatusOr<cudaEvent_t> event = TakeEventLocked();
    absl::Status recorded = event.ok() ? runtime->EventRecord(*event, stream) : event.status();
    if (recorded.ok()) {
      handoffs.push_back(Handoff{stream, *event});
      return absl::OkStatus();
    }
    if (event.ok()) free_events.push_back(*event);
    ++stats.synchronizations;
    return runtime->StreamSynchronize(stream);
  }

  // An allocation on `stream` may get a block another stream took back in its own order: `stream` waits for those
  // handoffs first (on the device). Completed handoffs are dropped.
  absl::Status OrderAfterHandoffsLocked(cudaStream_t stream) {
    if (handoffs.empty()) return absl::OkStatus();
    ScopedDevice device(runtime, options.device);
    if (!device.status().ok()) return device.status();
    std::vector<Handoff> still;
    absl::Status status;
    for (const Handoff& handoff : handoffs) {
      absl::StatusOr<bool> done = runtime->EventQuery(handoff.event);
      if (done.ok() && *done) {
        free_events.push_back(handoff.event);
        continue;
      }
      still.push_back(handoff);
      if (handoff.stream != stream && status.ok()) status = runtime->StreamWaitEvent(stream, handoff.event);
    }
    handoffs = std::move(still);
    return status;
  }

  // Pending blocks back to the arena under pressure: in the allocating stream's order when the caller is Allocate
  // (no host wait), else by waiting for their events on the host.
  absl::StatusOr<std::size_t> ReclaimUnderPressureLocked() {
    if (t_allocating_stream != nullptr) return ReclaimForStreamLocked(*t_allocating_stream);
    return ReclaimLocked(/*synchronize=*/true);
  }

  // A failed synchronization (an event that cannot be waited on) or the user handler's error is no lack of memory:
  // returned as is, the allocation fails with it.
  absl::StatusOr<bool> MakeRoom(Arena& target, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      absl::StatusOr<std::size_t> completed = ReclaimLocked(/*synchronize=*/false);
      if (completed.ok() && *completed > 0) return true;
      absl::StatusOr<std::size_t> waited = ReclaimUnderPressureLocked();
      if (!waited.ok()) return waited.status();
      if (*waited > 0) return true;
    }
    PressureHandler* user = handler.load(std::memory_order_acquire);
    if (user == nullptr) return false;
    const absl::StatusOr<bool> evicted = user->MakeRoom(target, bytes);
    // Frees made by the handler in multi-stream mode are pending: take them back so the arena sees them.
    std::lock_guard<std::mutex> lock(mu);
    absl::StatusOr<std::size_t> after = ReclaimUnderPressureLocked();
    if (!evicted.ok()) return evicted;
    if (!after.ok()) return after.status();
    return *evicted || *after > 0;
  }

  std::string ExhaustedMessage(std::size_t bytes, cudaStream_t stream, const absl::Status& status) {
    const std::size_t aligned = std::max<std::size_t>(1, (bytes + options.alignment - 1) / options.alignment) *
                                options.alignment;
    ArenaStats arena_stats;
    if (arena != nullptr) arena_stats = arena->Stats();
    std::string where;
    if (stitch_provider != nullptr) {
      // The budget counts physical granules: say how many are mapped and how many are free.
      const std::size_t free_physical = arena_stats.physical_limit - arena_stats.physical_bytes;
      const std::size_t granule = arena_stats.granule;
      where = absl::StrCat("; budget ", arena_stats.physical_limit, " bytes of physical memory in ", granule,
                           "-byte granules, mapped ", arena_stats.physical_bytes, " (", free_physical / granule,
                           " granule(s) free), allocated ", stats.allocated_bytes.current, ", pending frees ",
                           pending_bytes);
    } else {
      where = absl::StrCat("; budget ", resolved_budget, " bytes, allocated ", stats.allocated_bytes.current,
                           ", pending frees ", pending_bytes, ", free ", arena_stats.free_bytes,
                           ", largest free block ", arena_stats.largest_free_block);
    }
    return absl::StrCat("remat: CUDA memory budget exhausted on device ", options.device, ": tried to allocate ",
                        bytes, " bytes (", aligned, " aligned) on stream ",
                        absl::Hex(reinterpret_cast<std::uintptr_t>(stream)), where,
                        ". Raise the budget (REMAT_BUDGET) or let remat evict.",
                        RequestAboveBudgetNote(aligned, resolved_budget), " (", status.message(), ")");
  }
};

DeviceArena::DeviceArena(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeviceArena::~DeviceArena() = default;

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(CudaRuntime* runtime, DeviceArenaOptions options) {
  if (runtime == nullptr) return absl::InvalidArgumentError("remat: DeviceArena needs a CUDA runtime");
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("remat: invalid CUDA device ", options.device));
  }
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("remat: alignment ", options.alignment, " is not a power of two"));
  }
  if (options.budget == 0 && !(options.budget_fraction > 0 && options.budget_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("remat: the CUDA budget of device ", options.device,
                                                   " must be > 0 bytes or a fraction in (0, 1], got ",
                                                   options.budget_fraction));
  }
  auto state = std::make_unique<State>();
  state->runtime = runtime;
  state->options = options;
  return std::unique_ptr<DeviceArena>(new DeviceArena(std::move(state)));
}

absl::StatusOr<std::uintptr_t> DeviceArena::Allocate(std::size_t bytes, cudaStream_t stream, Placement placement) {
  State& s = *state_;
  std::shared_ptr<Arena> arena;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    absl::Status status = s.NoteStreamLocked(stream);
    if (status.ok()) status = s.OrderAfterHandoffsLocked(stream);
    if (!status.ok()) return status;
    status = s.EnsureArenaLocked();
    if (!status.ok()) {
      ++s.stats.ooms;
      return status;
    }
    (void)s.ReclaimLocked(/*synchronize=*/false);
    if (!s.bounce_frees.empty()) (void)s.FreeBouncesLocked(/*synchronize=*/false);
    arena = s.arena;
    ++s.inflight;
  }
  const cudaStream_t* outer = std::exchange(t_allocating_stream, &stream);  // the pressure path reclaims for it
  absl::StatusOr<std::uintptr_t> address = arena->Allocate(bytes, kNoOwner, placement);
  t_allocating_stream = outer;
  std::lock_guard<std::mutex> lock(s.mu);
  // Blocks another stream took back while this one made room: wait for them too (this block may be one).
  if (address.ok() && !s.handoffs.empty()) (void)s.OrderAfterHandoffsLocked(stream);
  --s.inflight;
  if (!address.ok()) {
    // Making room failed for another reason than memory (a page-out that could not be written): that error.
    if (!absl::IsResourceExhausted(address.status())) return address.status();
    ++s.stats.ooms;
    return absl::ResourceExhaustedError(s.ExhaustedMessage(bytes, stream, address.status()));
  }
  s.AddLiveLocked(*arena, *address, bytes, stream);
  return *address;
}

absl::Status DeviceArena::Free(std::uintptr_t address) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(address);
  if (it == s.live.end()) {
    return absl::InvalidArgumentError(absl::StrCat("remat: freeing ", absl::Hex(address),
                                                   ", which is not a live block of CUDA device ", s.options.device));
  }
  LiveBlock block = std::move(it->second);
  s.live.erase(it);
  s.stats.allocation.Decrease(1);
  s.stats.allocated_bytes.Decrease(static_cast<std::int64_t>(block.size));
  s.stats.requested_bytes.Decrease(static_cast<std::int64_t>(block.requested));
  if (!s.multi_stream) {
    s.ReturnToArenaLocked(address, block.size);
    return absl::OkStatus();
  }
  PendingBlock pending{address, block.size, {}, {}};
  ScopedDevice device(s.runtime, s.options.device);
  absl::Status status = device.status();
  block.uses.push_back(block.stream);
  for (cudaStream_t stream : block.uses) {
    if (!status.ok()) break;
    absl::StatusOr<cudaEvent_t> event = s.TakeEventLocked();
    if (!event.ok()) {
      status = event.status();
      break;
    }
    status = s.runtime->EventRecord(*event, stream);
    if (status.ok()) {
      pending.events.push_back(*event);
      pending.streams.push_back(stream);
    } else {
      s.free_events.push_back(*event);
    }
  }
  if (!status.ok()) {
    // Without an event we cannot know when the uses end: wait for the streams instead.
    for (cudaStream_t stream : block.uses) (void)s.runtime->StreamSynchronize(stream);
    for (cudaEvent_t event : pending.events) s.free_events.push_back(event);
    s.ReturnToArenaLocked(address, block.size);
    return status;
  }
  s.pending_bytes += block.size;
  s.pending.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status DeviceArena::RecordStream(std::uintptr_t address, cudaStream_t stream) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(address);
  if (it == s.live.end()) {
    return absl::InvalidArgumentError(absl::StrCat("remat: record_stream on ", absl::Hex(address),
                                                   ", which is not a live block of CUDA device ", s.options.device));
  }
  LiveBlock& block = it->second;
  if (stream == block.stream || std::find(block.uses.begin(), block.uses.end(), stream) != block.uses.end()) {
    return absl::OkStatus();
  }
  absl::Status status = s.NoteStreamLocked(stream);
  if (!status.ok()) return status;
  block.uses.push_back(stream);
  return absl::OkStatus();
}

bool DeviceArena::Owns(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->live.contains(address);
}

absl::StatusOr<std::size_t> DeviceArena::BlockSize(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->live.find(address);
  if (it == state_->live.end()) return absl::NotFoundError("remat: not a live CUDA block");
  return it->second.size;
}

absl::StatusOr<cudaStream_t> DeviceArena::BlockStream(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->live.find(address);
  if (it == state_->live.end()) return absl::NotFoundError("remat: not a live CUDA block");
  return it->second.stream;
}

absl::StatusOr<Segment> DeviceArena::SegmentOf(std::uintptr_t pointer) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  const State& s = *state_;
  if (s.arena == nullptr || pointer < s.segment_base || pointer >= s.segment_base + s.segment_size) {
    return absl::NotFoundError(absl::StrCat("remat: ", absl::Hex(pointer), " is not in CUDA device ",
                                            s.options.device, "'s arena"));
  }
  return Segment{s.segment_base, s.segment_size};
}

absl::StatusOr<std::size_t> DeviceArena::ReclaimPending(bool synchronize) {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->ReclaimLocked(synchronize);
}

absl::Status DeviceArena::EmptyCache() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  absl::StatusOr<std::size_t> reclaimed = s.ReclaimLocked(/*synchronize=*/true);
  if (!reclaimed.ok()) return reclaimed.status();
  if (absl::Status freed = s.FreeBouncesLocked(/*synchronize=*/true); !freed.ok()) return freed;
  const bool attached = s.handler.load(std::memory_order_acquire) != nullptr;
  if (s.live.empty() && s.pending.empty() && s.inflight == 0 && !attached) s.ReleaseArenaLocked();
  return absl::OkStatus();
}

absl::StatusOr<std::uintptr_t> DeviceArena::TryAllocate(std::size_t bytes, cudaStream_t stream,
                                                        Placement placement) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (absl::Status status = s.NoteStreamLocked(stream); !status.ok()) return status;
  if (absl::Status status = s.OrderAfterHandoffsLocked(stream); !status.ok()) return status;
  if (absl::Status status = s.EnsureArenaLocked(); !status.ok()) return status;
  (void)s.ReclaimLocked(/*synchronize=*/false);
  if (!s.bounce_frees.empty()) (void)s.FreeBouncesLocked(/*synchronize=*/false);
  absl::StatusOr<std::uintptr_t> address = s.arena->TryAllocate(bytes, kNoOwner, placement);
  if (!address.ok()) return address.status();
  s.AddLiveLocked(*s.arena, *address, bytes, stream);
  return *address;
}

absl::Status DeviceArena::Move(std::uintptr_t from, std::uintptr_t to) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(from);
  if (it == s.live.end() || s.arena == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("remat: moving ", absl::Hex(from),
                                                   ", which is not a live block of CUDA device ", s.options.device));
  }
  if (!it->second.uses.empty()) {
    return absl::FailedPreconditionError("remat: a block other streams use (record_stream) does not move");
  }
  if (from == to) return absl::OkStatus();
  if (absl::Status moved = s.arena->Move(from, to); !moved.ok()) return moved;
  LiveBlock block = std::move(it->second);
  s.live.erase(it);
  ScopedDevice device(s.runtime, s.options.device);
  absl::Status copied = device.status();
  if (copied.ok()) copied = s.CopyForMoveLocked(from, to, block.requested, block.stream);
  s.live[to] = std::move(block);
  if (!copied.ok()) {
    // The block has moved in the arena either way; its bytes did not (all of them).
    return absl::DataLossError(absl::StrCat("remat: sliding a block of CUDA device ", s.options.device, " from ",
                                            absl::Hex(from), " to ", absl::Hex(to),
                                            " failed, its contents are lost: ", copied.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Arena*> DeviceArena::Reserve() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (absl::Status status = s.EnsureArenaLocked(); !status.ok()) return status;
  return s.arena.get();
}

absl::Status DeviceArena::SetBudget(std::size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("remat: the CUDA budget must be > 0 bytes");
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (absl::Status empty = s.ReleaseForBudgetChangeLocked(); !empty.ok()) return empty;
  s.options.budget = bytes;
  s.options.budget_fraction = 0;
  s.resolved_budget = 0;
  return absl::OkStatus();
}

absl::Status DeviceArena::SetBudgetFraction(double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("remat: a CUDA memory fraction must be in (0, 1], got ", fraction));
  }
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (absl::Status empty = s.ReleaseForBudgetChangeLocked(); !empty.ok()) return empty;
  s.options.budget = 0;
  s.options.budget_fraction = fraction;
  s.resolved_budget = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> DeviceArena::Budget() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->ResolveBudgetLocked();
}

std::size_t DeviceArena::LargestFreeBlock() {
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  if (s.arena != nullptr) {
    const ArenaStats a = s.arena->Stats();
    // Stitched, the largest hole is address space (up to eight times the budget): what fits without eviction is
    // bounded by the granules not mapped (cuDNN sizes its workspace by this).
    if (s.stitch_provider != nullptr) return std::min(a.largest_free_block, a.physical_limit - a.physical_bytes);
    return a.largest_free_block;
  }
  absl::StatusOr<std::size_t> budget = s.ResolveBudgetLocked();
  return budget.ok() ? *budget : 0;
}

void DeviceArena::SetPressureHandler(PressureHandler* handler) {
  state_->handler.store(handler, std::memory_order_release);
}

bool DeviceArena::HasPressureHandler() const {
  return state_->handler.load(std::memory_order_acquire) != nullptr;
}

Arena* DeviceArena::arena() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->arena.get();
}

std::vector<BlockInfo> DeviceArena::Blocks() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<BlockInfo> blocks;
  if (state_->arena != nullptr) state_->arena->ForEachBlock([&](const BlockInfo& b) { blocks.push_back(b); });
  return blocks;
}

DeviceArenaStats DeviceArena::Stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  const State& s = *state_;
  DeviceArenaStats out = s.stats;
  out.budget = s.resolved_budget;
  out.pending_blocks = s.pending.size();
  out.pending_bytes = s.pending_bytes;
  out.multi_stream = s.multi_stream;
  out.pressure_allocations = static_cast<std::int64_t>(s.retired_pressure);
  if (s.arena != nullptr) {
    const ArenaStats a = s.arena->Stats();
    out.free_bytes = a.free_bytes;
    out.largest_free_block = a.largest_free_block;
    out.pressure_allocations += static_cast<std::int64_t>(a.pressure_allocations);
    out.physical_bytes = a.physical_bytes;
    out.peak_physical_bytes = a.peak_physical_bytes;
  }
  out.stitched = s.stitch_provider != nullptr;
  out.granule = out.stitched ? s.stitch_provider->granule() : 0;
  out.stitch = out.stitched ? s.stitch_provider->counters() : s.retired_stitch;
  out.stitch_fallback = s.stitch_fallback;
  return out;
}

void DeviceArena::ResetPeak() {
  std::lock_guard<std::mutex> lock(state_->mu);
  DeviceArenaStats& st = state_->stats;
  for (StatCounter* c : {&st.allocation, &st.allocated_bytes, &st.requested_bytes, &st.active, &st.active_bytes,
                         &st.segment, &st.reserved_bytes}) {
    c->peak = c->current;
  }
  if (state_->arena != nullptr) state_->arena->ResetPeak();
}

void DeviceArena::ResetAccumulated() {
  std::lock_guard<std::mutex> lock(state_->mu);
  DeviceArenaStats& st = state_->stats;
  for (StatCounter* c : {&st.allocation, &st.allocated_bytes, &st.requested_bytes, &st.active, &st.active_bytes,
                         &st.segment, &st.reserved_bytes}) {
    c->allocated = 0;
    c->freed = 0;
  }
  st.ooms = 0;
  st.synchronizations = 0;
  st.stream_ordered_reclaims = 0;
  st.device_mallocs = 0;
  st.device_frees = 0;
}

int DeviceArena::device() const { return state_->options.device; }

}  // namespace remat::cuda
