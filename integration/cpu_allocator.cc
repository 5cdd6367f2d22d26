// CPU allocator: see cpu_allocator.h for the contract.
//
// Lifetime of an arena. A LiveArena is counted: one reference while it is installed, one per block handed to
// torch and one per allocation in flight. Whoever drops the count to zero deletes it, so an uninstalled arena
// lives exactly as long as its last tensor. The registry (active arena + address ranges of every live arena,
// under one shared_mutex) lets the deleter, which only gets the data pointer, find the arena it belongs to; a
// pointer in no arena's range came from the allocator we replaced (forwarded allocations use our deleter too, so
// raw_deleter() is truthful) and goes back to that allocator's raw deleter.
#include "integration/cpu_allocator.h"

#include <ATen/MapAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/memory_provider.h"
#include "allocator/request_above_budget.h"
#include "integration/memory_events.h"

namespace remat::integration {
namespace {

struct LiveArena {
  std::unique_ptr<Arena> arena;
  std::size_t budget = 0;
  std::uintptr_t low = 0;   // the reserved segment: [low, high)
  std::uintptr_t high = 0;
  std::atomic<std::int64_t> refs{1};  // the installation's reference
  std::atomic<std::uint64_t> failed{0};
};

std::shared_mutex g_registry_mutex;
LiveArena* g_active = nullptr;             // guarded by g_registry_mutex
std::vector<LiveArena*> g_live;            // every arena not yet deleted; guarded by g_registry_mutex
// The allocator we replaced and its raw deleter; set at install, kept after uninstall.
std::atomic<c10::Allocator*> g_previous{nullptr};
std::atomic<c10::DeleterFnPtr> g_previous_raw_deleter{nullptr};
std::atomic<c10::DeleterFnPtr> g_storage_slice_deleter{nullptr};  // LearnStorageSliceDeleter
std::uint8_t g_priority = 0;
std::optional<CpuArenaStats> g_last_stats;  // guarded by g_registry_mutex
std::atomic<PressureHandler*> g_pressure_handler{nullptr};
// In a forked child: the arenas' locks may have been held by parent threads that do not exist here, so the child
// never touches an arena again (see CpuArenaChildAfterFork).
std::atomic<bool> g_forked_child{false};
thread_local Placement t_placement = Placement::kLow;
std::atomic<bool (*)()> g_inside_op{nullptr};  // SetCpuOutsideOpsProbe

Placement PlacementOfNextBlock() {
  bool (*inside_op)() = g_inside_op.load(std::memory_order_relaxed);
  return inside_op == nullptr || inside_op() ? t_placement : Placement::kTop;
}

void Unref(LiveArena* live) {
  if (live->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  {
    std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
    g_live.erase(std::remove(g_live.begin(), g_live.end(), live), g_live.end());
  }
  delete live;  // releases the segment to the host provider
}

CpuArenaStats StatsOf(const LiveArena& live, bool installed) {
  const ArenaStats s = live.arena->Stats();
  CpuArenaStats out;
  out.installed = installed;
  out.budget = live.budget;
  out.allocated_bytes = s.allocated_bytes;
  out.peak_allocated_bytes = s.peak_allocated_bytes;
  out.reserved_bytes = s.reserved_bytes;
  out.free_bytes = s.free_bytes;
  out.largest_free_block = s.largest_free_block;
  out.allocations = s.allocations;
  out.frees = s.frees;
  out.pressure_allocations = s.pressure_allocations;
  out.failed_allocations = live.failed.load(std::memory_order_relaxed);
  out.search_ns = s.search_ns;
  out.granule = s.granule;
  out.physical_bytes = s.physical_bytes;
  out.peak_physical_bytes = s.peak_physical_bytes;
  return out;
}

void Delete(void* pointer) {
  if (pointer == nullptr) return;
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  LiveArena* owner = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
    for (LiveArena* live : g_live) {
      if (address >= live->low && address < live->high) {
        owner = live;  // alive: this block holds a reference
        break;
      }
    }
  }
  if (owner != nullptr && g_forked_child.load(std::memory_order_relaxed)) return;  // the child's copy: left as is
  if (owner == nullptr) {
    const c10::DeleterFnPtr previous = g_previous_raw_deleter.load(std::memory_order_acquire);
    TORCH_INTERNAL_ASSERT(previous != nullptr, "remat: freeing a pointer no CPU arena owns");
    previous(pointer);
    return;
  }
  if (MemoryHistoryEnabled()) {
    absl::StatusOr<BlockInfo> block = owner->arena->Block(address);
    RecordMemoryEvent(MemoryEventKind::kFree, address, block.ok() ? block->size : 0);
  }
  const absl::Status status = owner->arena->Free(address);
  TORCH_INTERNAL_ASSERT(status.ok(), "remat: CPU arena free failed: ", std::string(status.message()));
  Unref(owner);
}

// A block's size in the arena (0 bytes take one alignment unit, as Arena::Allocate counts them).
std::size_t AlignedSize(std::size_t bytes) {
  return std::max<std::size_t>(1, (bytes + kCpuAlignment - 1) / kCpuAlignment) * kCpuAlignment;
}

std::string OutOfMemoryMessage(LiveArena& live, std::size_t bytes, const absl::Status& status) {
  live.failed.fetch_add(1, std::memory_order_relaxed);
  const ArenaStats s = live.arena->Stats();
  // A stitching arena's free blocks are address space (eight times the budget): what is free is granules.
  const std::string free = s.granule > 0 ? absl::StrCat(", physical ", s.physical_bytes, " of ", s.physical_limit,
                                                        " bytes mapped in ", s.granule, "-byte granules")
                                         : absl::StrCat(", free ", s.free_bytes, ", largest free block ",
                                                        s.largest_free_block);
  return absl::StrCat("remat: CPU memory budget exhausted: tried to allocate ", bytes, " bytes (",
                      AlignedSize(bytes), " aligned); budget ", live.budget, " bytes, allocated ", s.allocated_bytes,
                      free, ". Raise the budget given to remat.enable().",
                      RequestAboveBudgetNote(AlignedSize(bytes), live.budget), " (arena: ", status.message(), ")");
}

class ArenaCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    LiveArena* live = nullptr;
    {
      std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
      live = g_active;
      if (live != nullptr) live->refs.fetch_add(1, std::memory_order_relaxed);  // the block's reference
    }
    if (live == nullptr) return Forward(bytes);
    if (bytes == 0) {
      Unref(live);
      return c10::DataPtr(nullptr, nullptr, &Delete, cpu);
    }
    absl::StatusOr<std::uintptr_t> address = live->arena->Allocate(bytes, kNoOwner, PlacementOfNextBlock());
    if (!address.ok()) {
      bool retired = false;
      {
        std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
        retired = g_active != live;
      }
      if (retired) {  // remat was switched off while this allocation waited for room: torch's allocator serves it
        Unref(live);
        return Forward(bytes);
      }
      if (!absl::IsResourceExhausted(address.status())) {
        // Making room failed for another reason than memory (a page-out whose write to the host tier failed): that
        // reason is the error, not an out-of-memory one.
        Unref(live);
        TORCH_CHECK(false, "remat: allocating ", bytes, " bytes failed: ", std::string(address.status().message()));
      }
      const std::string message = OutOfMemoryMessage(*live, bytes, address.status());
      if (MemoryHistoryEnabled()) {
        RecordMemoryEvent(MemoryEventKind::kOutOfMemory, 0, AlignedSize(bytes), live->arena->Stats().free_bytes);
      }
      Unref(live);
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    }
    RecordMemoryEvent(MemoryEventKind::kAlloc, *address, AlignedSize(bytes));
    void* pointer = reinterpret_cast<void*>(*address);
    return c10::DataPtr(pointer, pointer, &Delete, cpu);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  // Not installed (any more): the allocator we replaced serves the request, under our deleter when it can.
  static c10::DataPtr Forward(std::size_t bytes) {
    c10::Allocator* previous = g_previous.load(std::memory_order_acquire);
    if (previous == nullptr) previous = c10::GetDefaultCPUAllocator();
    c10::DataPtr data = previous->allocate(bytes);
    const c10::DeleterFnPtr previous_deleter = g_previous_raw_deleter.load(std::memory_order_acquire);
    if (previous_deleter != nullptr && data.get() == data.get_context() && data.get_deleter() == previous_deleter) {
      void* pointer = data.release_context();
      return c10::DataPtr(pointer, pointer, &Delete, data.device());
    }
    return data;
  }
};

ArenaCpuAllocator* TheAllocator() {
  static auto* allocator = new ArenaCpuAllocator();  // never destroyed: StorageImpls point at it
  return allocator;
}

// Sets the CPU allocator at the lowest priority c10 accepts, which is the installed allocator's own.
absl::StatusOr<std::uint8_t> SetCpuAllocatorAtCurrentPriority(c10::Allocator* allocator) {
  for (int priority = 0; priority <= std::numeric_limits<std::uint8_t>::max(); ++priority) {
    c10::SetCPUAllocator(allocator, static_cast<std::uint8_t>(priority));
    if (c10::GetCPUAllocator() == allocator) return static_cast<std::uint8_t>(priority);
  }
  return absl::FailedPreconditionError("remat: c10 refused to install the CPU allocator at any priority");
}

}  // namespace

absl::Status InstallCpuArena(std::size_t budget, std::size_t stitch_granule) {
  if (budget == 0) return absl::InvalidArgumentError("remat: the CPU budget must be > 0 bytes");
  {
    std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
    if (g_active != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("remat: a CPU arena of ", g_active->budget, " bytes is already installed"));
    }
  }
  // Blocks are 64-byte multiples, so the arena is the budget rounded down to one: a hard limit, never above it.
  if (budget < kCpuAlignment) {
    return absl::InvalidArgumentError(absl::StrCat("remat: the CPU budget must be at least ", kCpuAlignment,
                                                   " bytes, got ", budget));
  }
  ArenaOptions options;
  options.capacity = budget / kCpuAlignment * kCpuAlignment;
  options.alignment = kCpuAlignment;
  options.grow = false;
  std::unique_ptr<MemoryProvider> provider;
  if (stitch_granule == 0) {
    provider = MakeHostProvider();
  } else {
    if (budget < stitch_granule) {
      return absl::InvalidArgumentError(absl::StrCat("remat: the CPU budget (", budget,
                                                     " bytes) must hold one granule of the stitching arena (",
                                                     stitch_granule, " bytes)"));
    }
    absl::StatusOr<std::unique_ptr<MemoryProvider>> stitch = MakeStitchHostProvider(budget, stitch_granule);
    if (!stitch.ok()) return stitch.status();
    provider = std::move(*stitch);
    options.granule = stitch_granule;
    options.physical_limit = budget / stitch_granule * stitch_granule;
    // Address space to spare (it costs nothing reserved): only granules in use are budgeted.
    options.capacity = 8 * options.physical_limit;
  }
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(std::move(provider), options);
  if (!arena.ok()) return arena.status();
  auto live = std::make_unique<LiveArena>();
  live->arena = std::move(*arena);
  live->budget = budget;
  live->low = std::numeric_limits<std::uintptr_t>::max();
  live->arena->ForEachBlock([&](const BlockInfo& block) {
    live->low = std::min(live->low, block.address);
    live->high = std::max(live->high, block.address + block.size);
  });
  if (live->high <= live->low) return absl::InternalError("remat: the CPU arena reserved no segment");
  live->arena->SetPressureHandler(g_pressure_handler.load(std::memory_order_acquire));

  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != TheAllocator()) {
    g_previous_raw_deleter.store(current->raw_deleter(), std::memory_order_release);
    g_previous.store(current, std::memory_order_release);
  }
  // Publish the arena before c10 hands out our allocator, so no request is forwarded by mistake.
  {
    std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
    g_active = live.get();
    g_live.push_back(live.get());
  }
  LiveArena* installed = live.release();
  absl::StatusOr<std::uint8_t> priority = SetCpuAllocatorAtCurrentPriority(TheAllocator());
  if (!priority.ok()) {
    {
      std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
      g_active = nullptr;
    }
    Unref(installed);
    return priority.status();
  }
  g_priority = *priority;
  return absl::OkStatus();
}

absl::Status UninstallCpuArena() {
  LiveArena* live = nullptr;
  {
    std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
    live = g_active;
    if (live == nullptr) return absl::FailedPreconditionError("remat: no CPU arena is installed");
    g_active = nullptr;
  }
  c10::Allocator* previous = g_previous.load(std::memory_order_acquire);
  if (c10::GetCPUAllocator() == TheAllocator() && previous != nullptr) c10::SetCPUAllocator(previous, g_priority);
  CpuArenaStats last = StatsOf(*live, /*installed=*/false);
  {
    std::unique_lock<std::shared_mutex> lock(g_registry_mutex);
    g_last_stats = last;
  }
  live->arena->SetPressureHandler(nullptr);  // the runtime may go away; the arena only frees from now on
  Unref(live);  // the installation's reference; deleted now if no tensor uses it
  return absl::OkStatus();
}

std::shared_ptr<void> RetainCpuArena() {
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  if (g_active == nullptr) return nullptr;
  g_active->refs.fetch_add(1, std::memory_order_relaxed);  // as a block's reference
  return std::shared_ptr<void>(g_active, [](void* live) { Unref(static_cast<LiveArena*>(live)); });
}

bool CpuArenaInstalled() {
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  return g_active != nullptr;
}

absl::StatusOr<CpuArenaStats> GetCpuArenaStats() {
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  if (g_active != nullptr) return StatsOf(*g_active, /*installed=*/true);
  if (g_last_stats.has_value()) return *g_last_stats;
  return absl::NotFoundError("remat: no CPU arena has been installed");
}

absl::Status ResetCpuArenaPeak() {
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  if (g_active == nullptr) return absl::FailedPreconditionError("remat: no CPU arena is installed");
  g_active->arena->ResetPeak();
  return absl::OkStatus();
}

void SetCpuPressureHandler(PressureHandler* handler) {
  g_pressure_handler.store(handler, std::memory_order_release);
  // Every live arena, the retired ones too (an allocation may still be in flight in one): each returns once no
  // call into the old handler is in flight. Without the registry lock meanwhile, which those calls free through.
  if (g_forked_child.load(std::memory_order_relaxed)) return;
  std::vector<LiveArena*> arenas;
  LiveArena* active = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
    active = g_active;
    for (LiveArena* live : g_live) {
      live->refs.fetch_add(1, std::memory_order_relaxed);
      arenas.push_back(live);
    }
  }
  for (LiveArena* live : arenas) {
    live->arena->SetPressureHandler(live == active || handler == nullptr ? handler : nullptr);
    Unref(live);
  }
}

void SetCpuPlacementForThisThread(Placement placement) { t_placement = placement; }

void SetCpuOutsideOpsProbe(bool (*inside_op)()) { g_inside_op.store(inside_op, std::memory_order_relaxed); }

c10::DataPtr TryAllocateInCpuArena(std::size_t bytes, Placement placement) {
  const c10::Device cpu(c10::DeviceType::CPU);
  LiveArena* live = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
    live = g_active;
    if (live != nullptr) live->refs.fetch_add(1, std::memory_order_relaxed);  // the block's reference
  }
  if (live == nullptr) return c10::DataPtr(nullptr, cpu);
  absl::StatusOr<std::uintptr_t> address = live->arena->TryAllocate(bytes, kNoOwner, placement);
  if (!address.ok()) {
    Unref(live);
    return c10::DataPtr(nullptr, cpu);
  }
  RecordMemoryEvent(MemoryEventKind::kAlloc, *address, AlignedSize(bytes));
  void* pointer = reinterpret_cast<void*>(*address);
  return c10::DataPtr(pointer, pointer, &Delete, cpu);
}

absl::Status SlideInCpuArena(c10::StorageImpl& storage, std::uintptr_t to) {
  c10::DataPtr& data = storage._mutable_data_ptr_no_checks();
  const auto from = reinterpret_cast<std::uintptr_t>(data.get());
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  if (data.get_deleter() != &Delete || g_active == nullptr || from < g_active->low || from >= g_active->high) {
    return absl::FailedPreconditionError("remat: only a block of the installed CPU arena can slide");
  }
  if (absl::Status moved = g_active->arena->Move(from, to); !moved.ok()) return moved;
  RecordMemoryEvent(MemoryEventKind::kMove, from, AlignedSize(storage.nbytes()), to);
  std::memmove(reinterpret_cast<void*>(to), reinterpret_cast<void*>(from), storage.nbytes());
  // The block (and the arena reference it holds) now lives at `to`: the old DataPtr must not free anything.
  void* pointer = reinterpret_cast<void*>(to);
  c10::DataPtr old = storage.set_data_ptr(c10::DataPtr(pointer, pointer, &Delete, data.device()));
  (void)old.release_context();
  return absl::OkStatus();
}

std::vector<BlockInfo> CpuArenaBlocks() {
  std::vector<BlockInfo> blocks;
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  if (g_active != nullptr) g_active->arena->ForEachBlock([&](const BlockInfo& block) { blocks.push_back(block); });
  return blocks;
}

Arena* InstalledCpuArena() {
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  return g_active != nullptr ? g_active->arena.get() : nullptr;
}

bool AllocatedByRematArena(const c10::DataPtr& data) {
  if (data.get_deleter() != &Delete || data.get() == nullptr) return false;
  const auto address = reinterpret_cast<std::uintptr_t>(data.get());
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  for (const LiveArena* live : g_live) {
    if (address >= live->low && address < live->high) return true;
  }
  return false;
}

bool BorrowedCpuMemory(const c10::DataPtr& data) {
  if (data.get() == nullptr) return false;
  const c10::DeleterFnPtr deleter = data.get_deleter();
  if (deleter == &Delete || deleter == g_previous_raw_deleter.load(std::memory_order_acquire) ||
      deleter == c10::GetDefaultCPUAllocator()->raw_deleter()) {
    return false;
  }
  if (deleter == g_storage_slice_deleter.load(std::memory_order_acquire)) {
    // A slice: its bytes are its parent's. A parent in an arena may be evicted or moved under the slice's pointer,
    // so ops reading the slice are not replayed (as for borrowed memory).
    const auto* parent = static_cast<const c10::StorageImpl*>(data.get_context());
    if (parent == nullptr) return true;
    const c10::DataPtr& parent_data = parent->data_ptr();
    return AllocatedByRematArena(parent_data) || BorrowedCpuMemory(parent_data);
  }
  return at::MapAllocator::fromDataPtr(data) == nullptr && at::RefcountedMapAllocator::fromDataPtr(data) == nullptr;
}

void LearnStorageSliceDeleter(const c10::DataPtr& slice) {
  TORCH_CHECK(slice.get_deleter() != nullptr && slice.get_context() != nullptr,
              "remat: learn_storage_slice wants a tensor over a slice of an UntypedStorage (storage[a:b])");
  g_storage_slice_deleter.store(slice.get_deleter(), std::memory_order_release);
}

std::size_t LiveCpuArenaCount() {
  std::shared_lock<std::shared_mutex> lock(g_registry_mutex);
  return g_live.size();
}

c10::Allocator* RematCpuAllocator() { return TheAllocator(); }

void CpuArenaPrepareFork() { g_registry_mutex.lock(); }

void CpuArenaParentAfterFork() { g_registry_mutex.unlock(); }

bool InForkedChildOfCpuArena() { return g_forked_child.load(std::memory_order_relaxed); }

void CpuArenaChildAfterFork() {
  g_forked_child.store(true, std::memory_order_relaxed);
  g_active = nullptr;  // torch's own allocator serves the child (our allocator forwards to it)
  // A fresh lock rather than an unlock: glibc's rwlock knows its writer by thread id, which differs in the child.
  new (&g_registry_mutex) std::shared_mutex();
}

}  // namespace remat::integration
