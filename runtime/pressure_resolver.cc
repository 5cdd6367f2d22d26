// PressureResolver: making room when an allocation does not fit (pressure_resolver.h).
#include "runtime/pressure_resolver.h"

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

absl::StatusOr<bool> PressureResolver::MakeRoom(Arena& arena, std::size_t bytes) {
  const absl::StatusOr<bool> made = MakeRoomOnce(arena, bytes);
  // Only a lack of room is worth a retry (MakeHoleForRetry); a failed page-out or move is the caller's error.
  failed_request_ = made.ok() && !*made ? bytes : 0;
  return made;
}

absl::StatusOr<bool> PressureResolver::MakeHoleForRetry() {
  Arena* arena = engine_.options_.arena;
  if (arena == nullptr || failed_request_ == 0) return false;
  // The kernel runs again from the start: its inputs may move. When no hole can be made (a barrier: an argument
  // of a composite op around the kernel), the request stays for the composite's own retry, which frees it.
  absl::StatusOr<bool> made = engine_.impl_->defrag->HoleForRetry(*engine_.executor_, *arena, failed_request_);
  if (!made.ok() || *made) failed_request_ = 0;
  return made;
}

absl::StatusOr<bool> PressureResolver::MakeRoomOnce(Arena& arena, std::size_t bytes) {
  Engine::Impl& m = *engine_.impl_;
  EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  if (m.pager->prefetching()) return false;
  if (!pressure_sampled_) {
    pressure_sampled_ = true;
    ArenaStats s = arena.Stats();
    // Free when pressure begins: bytes outside blocks, or (stitching) granules not mapped.
    const std::size_t free = arena.stitched() ? s.physical_limit - s.physical_bytes : s.free_bytes;
    if (options.budget > 0) {
      stats.fragmentation_sum += static_cast<double>(free) / static_cast<double>(options.budget);
      ++stats.fragmentation_samples;
    }
  }
  std::int64_t start = NowNs();
  // Storages released while a replay could read them were kept resident for as long as memory allowed: they go
  // first, as eager eviction would have dropped them at release.
  if (engine_.DropReleased() > 0) {
    stats.search_ns += NowNs() - start;
    return true;
  }
  absl::Cleanup redefer = [this] { RedeferUnchosen(); };  // after the choice's victims are evicted
  // When the policy has nothing left: page a constant, or move memory; deferred storages (gradients) go last. Each
  // step answers whether it made room, or why it failed (a page-out that could not write, a failed move).
  // A stitching arena neither moves blocks nor needs a hole: the policy ranks by cost alone, windows included.
  const bool stitched = arena.stitched();
  // Windows already count free blocks as part of the range they clear (Coop): compacting first made it run out at
  // lower ratios (remat-sim, lstm and densenet121 at 0.2, unet at 0.4).
  const bool uses_windows = options.policy->UsesWindows();
  if (!stitched && !uses_windows && options.compact_first_limit > 0 && arena.Stats().free_bytes >= bytes) {
    const std::size_t limit = bytes > std::numeric_limits<std::size_t>::max() / options.compact_first_limit
                                  ? std::numeric_limits<std::size_t>::max()
                                  : bytes * options.compact_first_limit;
    absl::StatusOr<bool> compacted =
        m.defrag->Compact(*engine_.executor_, arena, bytes, m.remat->running_kernel(), limit);
    if (!compacted.ok() || *compacted) {
      stats.search_ns += NowNs() - start;
      return compacted;
    }
  }
  auto last_resort = [&]() -> absl::StatusOr<bool> {
    absl::StatusOr<bool> made = m.pager->PageLruConstant();
    if (stitched) return made;
    if (made.ok() && !*made) made = m.defrag->RelocateIdle(*engine_.executor_, arena, bytes, m.remat->running_kernel());
    if (made.ok() && !*made) made = m.defrag->Compact(*engine_.executor_, arena, bytes, m.remat->running_kernel());
    return made;
  };
  if (uses_windows && !stitched) {
    std::optional<Window> window = engine_.ChooseWindow(arena, bytes);
    stats.search_ns += NowNs() - start;
    if (!window || window->owners.empty()) {
      if (absl::StatusOr<bool> made = last_resort(); !made.ok() || *made) return made;
      if (!ReleaseDeferred()) return false;
      window = engine_.ChooseWindow(arena, bytes);
      if (!window || window->owners.empty()) return false;
    }
    for (OwnerId o : window->owners) {
      if (absl::Status s = m.pager->Reclaim(static_cast<StorageIndex>(o - 1)); !s.ok()) return s;
    }
    return true;
  }
  if (m.pool.empty()) {
    stats.search_ns += NowNs() - start;
    if (absl::StatusOr<bool> made = last_resort(); !made.ok() || *made) return made;
    if (!ReleaseDeferred()) return false;
    start = NowNs();
  }
  std::optional<StorageIndex> pick = engine_.ChooseFromPool();
  stats.search_ns += NowNs() - start;
  if (!pick) return false;
  if (absl::Status s = m.pager->Reclaim(*pick); !s.ok()) return s;
  return true;
}

absl::Status PressureResolver::MakeRoomCounter(std::int64_t bytes, std::string_view what) {
  Engine::Impl& m = *engine_.impl_;
  EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  while (stats.used_bytes + bytes > options.budget) {
    if (engine_.DropReleased() > 0) continue;  // as in MakeRoomOnce: storages released but kept go first
    if (m.pool.empty()) {
      absl::StatusOr<bool> paged = m.pager->PageLruConstant();
      if (!paged.ok()) return paged.status();
      if (*paged) continue;
    }
    absl::Cleanup redefer = [this] { RedeferUnchosen(); };  // after this round's victim is evicted
    if (m.pool.empty() && !ReleaseDeferred()) {
      std::int64_t locked = 0;
      for (const GraphRecords::Storage& st : m.storages) {
        if (st.material && st.locks > 0 && !st.pinned) locked += st.size;
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of memory running '%s': requested %d bytes, budget %d, in use %d (locked by the running ops %d, "
          "constant %d), nothing left to evict",
          what, bytes, options.budget, stats.used_bytes, locked, m.constant_bytes));
    }
    std::int64_t start = NowNs();
    std::optional<StorageIndex> pick = engine_.ChooseFromPool();
    stats.search_ns += NowNs() - start;
    if (!pick) return absl::InternalError("policy chose nothing from a non-empty pool");
    if (absl::Status s = m.pager->Reclaim(*pick); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool PressureResolver::ReleaseDeferred() {
  Engine::Impl& m = *engine_.impl_;
  if (m.deferred_list.empty()) return false;
  released_.clear();
  released_.swap(m.deferred_list);
  std::size_t kept = 0;
  for (StorageIndex s : released_) {
    GraphRecords::Storage& st = m.storages[s];
    if (!st.deferred || m.InPool(s) || !st.material || st.locks > 0 || st.pinned) continue;
    m.PoolAppend(s, /*reserve=*/false);  // still deferred: RedeferUnchosen takes it out again unless chosen
    released_[kept++] = s;
  }
  released_.resize(kept);
  ++engine_.stats_.deferred_releases;
  return !m.pool.empty();
}

void PressureResolver::RedeferUnchosen() {
  Engine::Impl& m = *engine_.impl_;
  for (StorageIndex s : released_) {
    GraphRecords::Storage& st = m.storages[s];
    if (!st.deferred) continue;  // pinned since
    if (m.InPool(s)) {
      m.PoolRemove(s);
      m.PoolAppend(s);  // into deferred_list
    }
  }
  released_.clear();
}

}  // namespace remat
