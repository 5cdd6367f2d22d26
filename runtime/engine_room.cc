// Engine: making room when an allocation does not fit: in the arena (MakeRoom, the retry hole, relocating idle
// blocks out of the cheapest window, compacting a run of blocks) and against the budget in counter mode
// (MakeRoomCounter), as engine.h's contract says.
#include "runtime/engine.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/engine_impl.h"

namespace remat {

absl::StatusOr<bool> Engine::MakeRoom(Arena& arena, std::size_t bytes) {
  const absl::StatusOr<bool> made = MakeRoomOnce(arena, bytes);
  // Only a lack of room is worth a retry (MakeHoleForRetry); a failed page-out or move is the caller's error.
  failed_request_ = made.ok() && !*made ? bytes : 0;
  return made;
}

absl::StatusOr<bool> Engine::MakeHoleForRetry() {
  Arena* arena = options_.arena;
  // A stitching arena has no holes to make: a request needs free granules, which only eviction gives.
  if (arena == nullptr || failed_request_ == 0 || arena->stitched()) return false;
  const std::size_t bytes = failed_request_;
  failed_request_ = 0;
  const OpId kernel = running_kernel_;
  running_kernel_ = kNoKernel;
  // The kernel may allocate more than the request it failed on: gather every free byte into one hole if nothing
  // stands in the way, else as many as the request needs.
  const std::size_t alignment = arena->alignment();
  const std::size_t all_free = arena->Stats().free_bytes / alignment * alignment;
  absl::StatusOr<bool> compacted = all_free > bytes ? Compact(*arena, all_free) : false;
  if (compacted.ok() && !*compacted) compacted = Compact(*arena, bytes);
  running_kernel_ = kernel;
  if (!compacted.ok()) return compacted.status();
  return arena->Stats().largest_free_block >= bytes;
}

absl::StatusOr<bool> Engine::MakeRoomOnce(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  if (no_reclaim_) return false;
  if (!pressure_sampled_) {
    pressure_sampled_ = true;
    ArenaStats s = arena.Stats();
    // Free when pressure begins: bytes outside blocks, or (stitching) granules not mapped.
    const std::size_t free = arena.stitched() ? s.physical_limit - s.physical_bytes : s.free_bytes;
    if (options_.budget > 0) {
      stats_.fragmentation_sum += static_cast<double>(free) / static_cast<double>(options_.budget);
      ++stats_.fragmentation_samples;
    }
  }
  std::int64_t start = NowNs();
  absl::Cleanup redefer = [this] { RedeferUnchosen(); };  // after the choice's victims are evicted
  // When the policy has nothing left: page a constant, or move memory; deferred storages (gradients) go last. Each
  // step answers whether it made room, or why it failed (a page-out that could not write, a failed move).
  // A stitching arena neither moves blocks nor needs a hole: the policy ranks by cost alone, windows included.
  const bool stitched = arena.stitched();
  // Windows already count free blocks as part of the range they clear (Coop): compacting first made it run out at
  // lower ratios (remat-sim, lstm and densenet121 at 0.2, unet at 0.4).
  const bool uses_windows = options_.policy->UsesWindows();
  if (!stitched && !uses_windows && options_.compact_first_limit > 0 && arena.Stats().free_bytes >= bytes) {
    const std::size_t limit = bytes > std::numeric_limits<std::size_t>::max() / options_.compact_first_limit
                                  ? std::numeric_limits<std::size_t>::max()
                                  : bytes * options_.compact_first_limit;
    absl::StatusOr<bool> compacted = Compact(arena, bytes, limit);
    if (!compacted.ok() || *compacted) {
      stats_.search_ns += NowNs() - start;
      return compacted;
    }
  }
  auto last_resort = [&]() -> absl::StatusOr<bool> {
    absl::StatusOr<bool> made = PageLruConstant();
    if (stitched) return made;
    if (made.ok() && !*made) made = RelocateIdle(arena, bytes);
    if (made.ok() && !*made) made = Compact(arena, bytes);
    return made;
  };
  if (uses_windows && !stitched) {
    std::optional<Window> window = ChooseWindow(arena, bytes);
    stats_.search_ns += NowNs() - start;
    if (!window || window->owners.empty()) {
      if (absl::StatusOr<bool> made = last_resort(); !made.ok() || *made) return made;
      if (!ReleaseDeferred()) return false;
      window = ChooseWindow(arena, bytes);
      if (!window || window->owners.empty()) return false;
    }
    for (OwnerId o : window->owners) {
      if (absl::Status s = Reclaim(static_cast<StorageIndex>(o - 1)); !s.ok()) return s;
    }
    return true;
  }
  if (m.pool.empty()) {
    stats_.search_ns += NowNs() - start;
    if (absl::StatusOr<bool> made = last_resort(); !made.ok() || *made) return made;
    if (!ReleaseDeferred()) return false;
    start = NowNs();
  }
  std::optional<StorageIndex> pick = ChooseFromPool();
  stats_.search_ns += NowNs() - start;
  if (!pick) return false;
  if (absl::Status s = Reclaim(*pick); !s.ok()) return s;
  return true;
}

bool Engine::UsedByRunningKernel(StorageIndex s) const {
  const Impl& m = *impl_;
  if (running_kernel_ == kNoKernel) return false;
  const Impl::Op& op = m.ops[running_kernel_];
  for (TensorId t : m.Inputs(op)) {
    if (m.tensors[t].storage == s) return true;
  }
  for (TensorId t : m.Outputs(op)) {
    if (m.tensors[t].storage == s) return true;
  }
  return false;
}

absl::StatusOr<bool> Engine::RelocateIdle(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  if (!options_.relocate) return false;
  // Resident storages the policy cannot evict (constants, pinned results, inputs locked by an op still gathering
  // the others) that no running kernel touches, by address.
  absl::flat_hash_map<std::uintptr_t, StorageIndex> movable;
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    const Impl::Storage& st = m.storages[s];
    if (!st.material || !st.has_address || st.paged || m.InPool(s) || st.fixed || st.holds > 0) continue;
    if (!st.pinned && st.locks == 0) continue;
    if (UsedByRunningKernel(s)) continue;
    movable.emplace(st.address, s);
  }
  if (movable.empty()) return false;
  // The run that needs the fewest bytes moved: free blocks cost nothing, movable storages their size, anything
  // else (in use, or evictable but not evicted: the policy had its chance) is a barrier.
  std::optional<Window> window = arena.FindWindow(bytes, [&](const BlockInfo& block) -> std::optional<double> {
    if (movable.contains(block.address)) return static_cast<double>(block.size);
    return std::nullopt;
  });
  if (!window) return false;
  const Executor::AddressRange avoid{window->address, window->address + window->size};
  std::vector<std::pair<std::uintptr_t, StorageIndex>> inside;
  for (const auto& [address, s] : movable) {
    if (avoid.Overlaps(address, static_cast<std::size_t>(m.storages[s].size))) inside.emplace_back(address, s);
  }
  std::sort(inside.begin(), inside.end());
  bool moved = false;
  for (const auto& [address, s] : inside) {
    absl::StatusOr<bool> relocated = executor_->Relocate(*this, s, avoid);
    if (!relocated.ok()) return relocated.status();
    if (!*relocated) break;  // no hole outside the window holds it
    moved = true;
    ++stats_.relocations;
    stats_.relocated_bytes += m.storages[s].size;
    // A storage locked only for now joins the pool later: its new block must name it for the window policies.
    if (!m.storages[s].pinned) (void)arena.SetOwner(m.storages[s].address, OwnerId{s} + 1);
  }
  return moved;
}

absl::StatusOr<bool> Engine::Compact(Arena& arena, std::size_t bytes, std::size_t max_moved) {
  Impl& m = *impl_;
  if (!options_.relocate) return false;
  // Blocks in address order; `storage` is kNoStorage for a barrier (unknown to the engine, or in use now).
  constexpr StorageIndex kNoStorage = ~StorageIndex{0};
  struct Block {
    std::uintptr_t address;
    std::size_t size;
    bool free;
    StorageIndex storage;
  };
  absl::flat_hash_map<std::uintptr_t, StorageIndex> movable;
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    const Impl::Storage& st = m.storages[s];
    if (st.material && st.has_address && !st.paged && !st.fixed && st.holds == 0 && !UsedByRunningKernel(s)) {
      movable.emplace(st.address, s);
    }
  }
  std::vector<Block> blocks;
  arena.ForEachBlock([&](const BlockInfo& b) {
    auto it = b.free ? movable.end() : movable.find(b.address);
    blocks.push_back(Block{b.address, b.size, b.free, it == movable.end() ? kNoStorage : it->second});
  });
  // Two pointers over each run between barriers (and segment gaps): the window [l, r] whose free bytes hold the
  // request with the fewest storage bytes inside. With l as far right as the request allows, the window starts
  // with a free block, so every storage in it slides.
  std::size_t best_l = 0, best_r = 0, best_cost = std::numeric_limits<std::size_t>::max();
  std::size_t l = 0, free_sum = 0, cost = 0;
  for (std::size_t r = 0; r < blocks.size(); ++r) {
    const bool gap = r > 0 && blocks[r - 1].address + blocks[r - 1].size != blocks[r].address;
    if (gap) l = r, free_sum = 0, cost = 0;
    const Block& b = blocks[r];
    if (!b.free && b.storage == kNoStorage) {
      l = r + 1, free_sum = 0, cost = 0;
      continue;
    }
    (b.free ? free_sum : cost) += b.size;
    for (; l < r; ++l) {
      const Block& first = blocks[l];
      if (first.free && free_sum - first.size < bytes) break;
      (first.free ? free_sum : cost) -= first.size;
    }
    if (free_sum >= bytes && cost < best_cost) best_l = l, best_r = r, best_cost = cost;
  }
  if (best_cost == std::numeric_limits<std::size_t>::max() || best_cost == 0 || best_cost > max_moved) return false;
  std::uintptr_t to = blocks[best_l].address;
  bool moved = false;
  for (std::size_t i = best_l; i <= best_r; ++i) {
    const Block& b = blocks[i];
    if (b.free) continue;
    absl::StatusOr<bool> slid = executor_->Slide(*this, b.storage, to);
    if (!slid.ok()) return slid.status();
    if (!*slid) break;  // the executor cannot move it: what moved so far still joined some holes
    moved = true;
    stats_.compacted_bytes += static_cast<std::int64_t>(b.size);
    to += b.size;
  }
  stats_.compactions += moved;
  return moved;
}

absl::Status Engine::MakeRoomCounter(std::int64_t bytes, std::string_view what) {
  Impl& m = *impl_;
  while (stats_.used_bytes + bytes > options_.budget) {
    if (m.pool.empty()) {
      absl::StatusOr<bool> paged = PageLruConstant();
      if (!paged.ok()) return paged.status();
      if (*paged) continue;
    }
    absl::Cleanup redefer = [this] { RedeferUnchosen(); };  // after this round's victim is evicted
    if (m.pool.empty() && !ReleaseDeferred()) {
      std::int64_t locked = 0;
      for (const Impl::Storage& st : m.storages) {
        if (st.material && st.locks > 0 && !st.pinned) locked += st.size;
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of memory running '%s': requested %d bytes, budget %d, in use %d (locked by the running ops %d, "
          "constant %d), nothing left to evict",
          what, bytes, options_.budget, stats_.used_bytes, locked, m.constant_bytes));
    }
    std::int64_t start = NowNs();
    std::optional<StorageIndex> pick = ChooseFromPool();
    stats_.search_ns += NowNs() - start;
    if (!pick) return absl::InternalError("policy chose nothing from a non-empty pool");
    if (absl::Status s = Reclaim(*pick); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace remat
