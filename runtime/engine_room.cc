// Engine: the pressure resolver, making room when an allocation does not fit: in the arena (MakeRoom: the ordered
// steps, the moves asked of the defragmenter, runtime/defragmenter.h; the retry hole) and against the budget in
// counter mode (MakeRoomCounter), as engine.h's contract says.
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
  if (arena == nullptr || failed_request_ == 0) return false;
  const std::size_t bytes = failed_request_;
  failed_request_ = 0;
  // The kernel runs again from the start: its inputs may move.
  return impl_->defrag->HoleForRetry(*executor_, *arena, bytes);
}

absl::StatusOr<bool> Engine::MakeRoomOnce(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  if (m.pager->prefetching()) return false;
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
    absl::StatusOr<bool> compacted = m.defrag->Compact(*executor_, arena, bytes, m.remat->running_kernel(), limit);
    if (!compacted.ok() || *compacted) {
      stats_.search_ns += NowNs() - start;
      return compacted;
    }
  }
  auto last_resort = [&]() -> absl::StatusOr<bool> {
    absl::StatusOr<bool> made = m.pager->PageLruConstant();
    if (stitched) return made;
    if (made.ok() && !*made) made = m.defrag->RelocateIdle(*executor_, arena, bytes, m.remat->running_kernel());
    if (made.ok() && !*made) made = m.defrag->Compact(*executor_, arena, bytes, m.remat->running_kernel());
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
      if (absl::Status s = m.pager->Reclaim(static_cast<StorageIndex>(o - 1)); !s.ok()) return s;
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
  if (absl::Status s = m.pager->Reclaim(*pick); !s.ok()) return s;
  return true;
}

absl::Status Engine::MakeRoomCounter(std::int64_t bytes, std::string_view what) {
  Impl& m = *impl_;
  while (stats_.used_bytes + bytes > options_.budget) {
    if (m.pool.empty()) {
      absl::StatusOr<bool> paged = m.pager->PageLruConstant();
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
    if (absl::Status s = m.pager->Reclaim(*pick); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace remat
