// Defragmenter: relocation of idle unevictable storages, compaction of a run, the hole for a retried kernel
// (defragmenter.h).
#include "runtime/defragmenter.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace remat {

bool Defragmenter::UsedByKernel(StorageIndex s, OpId kernel) const {
  if (kernel == Engine::kNoKernel) return false;
  const GraphRecords::Op& op = records_.ops[kernel];
  for (TensorId t : records_.Inputs(op)) {
    if (records_.tensors[t].storage == s) return true;
  }
  for (TensorId t : records_.Outputs(op)) {
    if (records_.tensors[t].storage == s) return true;
  }
  return false;
}

absl::StatusOr<bool> Defragmenter::HoleForRetry(Executor& executor, Arena& arena, std::size_t bytes) {
  if (arena.stitched()) return false;
  const std::size_t alignment = arena.alignment();
  const std::size_t all_free = arena.Stats().free_bytes / alignment * alignment;
  absl::StatusOr<bool> compacted = all_free > bytes ? Compact(executor, arena, all_free, Engine::kNoKernel) : false;
  if (compacted.ok() && !*compacted) compacted = Compact(executor, arena, bytes, Engine::kNoKernel);
  if (!compacted.ok()) return compacted.status();
  return arena.Stats().largest_free_block >= bytes;
}

absl::StatusOr<bool> Defragmenter::RelocateIdle(Executor& executor, Arena& arena, std::size_t bytes,
                                                OpId running_kernel) {
  if (!enabled_) return false;
  const auto& storages = records_.storages;
  // Resident storages the policy cannot evict (constants, pinned results, inputs locked by an op still gathering
  // the others) that no running kernel touches, by address.
  movable_.clear();
  for (StorageIndex s = 0; s < storages.size(); ++s) {
    const GraphRecords::Storage& st = storages[s];
    if (!st.material || !st.has_address || st.paged || pool_.Contains(s) || st.fixed || st.holds > 0) continue;
    if (!st.pinned && st.locks == 0) continue;
    if (UsedByKernel(s, running_kernel)) continue;
    movable_.emplace(st.address, s);
  }
  if (movable_.empty()) return false;
  // The run that needs the fewest bytes moved: free blocks cost nothing, movable storages their size, anything
  // else (in use, or evictable but not evicted: the policy had its chance) is a barrier.
  std::optional<Window> window = arena.FindWindow(bytes, [&](const BlockInfo& block) -> std::optional<double> {
    if (movable_.contains(block.address)) return static_cast<double>(block.size);
    return std::nullopt;
  });
  if (!window) return false;
  const Executor::AddressRange avoid{window->address, window->address + window->size};
  std::vector<std::pair<std::uintptr_t, StorageIndex>> inside;
  for (const auto& [address, s] : movable_) {
    if (avoid.Overlaps(address, static_cast<std::size_t>(storages[s].size))) inside.emplace_back(address, s);
  }
  std::sort(inside.begin(), inside.end());
  bool moved = false;
  for (const auto& [address, s] : inside) {
    absl::StatusOr<bool> relocated = executor.Relocate(engine_, s, avoid);
    if (!relocated.ok()) return relocated.status();
    if (!*relocated) break;  // no hole outside the window holds it
    moved = true;
    ++stats_.relocations;
    stats_.relocated_bytes += storages[s].size;
    // A storage locked only for now joins the pool later: its new block must name it for the window policies.
    if (!storages[s].pinned) (void)arena.SetOwner(storages[s].address, OwnerId{s} + 1);
  }
  return moved;
}

absl::StatusOr<bool> Defragmenter::Compact(Executor& executor, Arena& arena, std::size_t bytes, OpId running_kernel,
                                           std::size_t max_moved) {
  if (!enabled_) return false;
  // Blocks in address order; `storage` is kNoStorage for a barrier (unknown to the engine, or in use now).
  constexpr StorageIndex kNoStorage = ~StorageIndex{0};
  struct Block {
    std::uintptr_t address;
    std::size_t size;
    bool free;
    StorageIndex storage;
  };
  movable_.clear();
  for (StorageIndex s = 0; s < records_.storages.size(); ++s) {
    const GraphRecords::Storage& st = records_.storages[s];
    if (st.material && st.has_address && !st.paged && !st.fixed && st.holds == 0 && !UsedByKernel(s, running_kernel)) {
      movable_.emplace(st.address, s);
    }
  }
  std::vector<Block> blocks;
  arena.ForEachBlock([&](const BlockInfo& b) {
    auto it = b.free ? movable_.end() : movable_.find(b.address);
    blocks.push_back(Block{b.address, b.size, b.free, it == movable_.end() ? kNoStorage : it->second});
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
    absl::StatusOr<bool> slid = executor.Slide(engine_, b.storage, to);
    if (!slid.ok()) return slid.status();
    if (!*slid) break;  // the executor cannot move it: what moved so far still joined some holes
    moved = true;
    stats_.compacted_bytes += static_cast<std::int64_t>(b.size);
    to += b.size;
  }
  stats_.compactions += moved;
  return moved;
}

}  // namespace remat
