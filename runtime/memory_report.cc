// MemoryReport: what an out-of-memory error says about the engine's memory (memory_report.h).
#include "runtime/memory_report.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/engine_impl.h"

namespace remat {

absl::Status MemoryReport::Annotate(absl::string_view message, absl::string_view context) const {
  if (absl::StrContains(message, kMarker)) return absl::ResourceExhaustedError(absl::StrCat(message, context));
  return absl::ResourceExhaustedError(absl::StrCat(message, context, "; ", Describe()));
}

std::string MemoryReport::Describe() const {
  const Engine::Impl& m = *engine_.impl_;
  const EngineOptions& options = engine_.options_;
  const EngineStats& stats = engine_.stats_;
  std::int64_t locked = 0, pinned = 0, constant_in_arena = 0;
  for (const GraphRecords::Storage& st : m.storages) {
    if (!st.material) continue;
    if (st.locks > 0 && !st.pinned) locked += st.size;
    if (st.pinned && !st.constant) pinned += st.size;
    if (st.constant && st.has_address) constant_in_arena += st.size;
  }
  std::string report = absl::StrFormat("budget %d, in use %d (%s %d, constant %d", options.budget,
                                       stats.used_bytes, kMarker, locked, m.constant_bytes);
  // Arena mode: constants made outside the arena (parameters made before remat) count in use but take no block;
  // results pinned for good (gradients and optimizer state once written) take blocks remat cannot evict.
  if (options.arena != nullptr) absl::StrAppend(&report, " of which ", constant_in_arena, " in the arena");
  absl::StrAppend(&report, ", pinned results ", pinned);
  // Blocks of no storage the engine knows: the running kernels' own buffers, or memory made where remat cannot see.
  if (options.arena != nullptr) absl::StrAppend(&report, ", in blocks remat does not know ", UnknownArenaBytes());
  absl::StrAppend(&report, ")");
  // Where it happened: the op the caller runs and, when it ran out while replaying, the innermost replay; or the
  // kernel running between BeginOp and EndOp.
  const Rematerializer::Where where = m.remat->where();
  if (where.op != Engine::kNoKernel && where.op < m.ops.size()) {
    // A result asked back on its own is not an op the program runs now: say so, or the report blames an op
    // (a forward pass's 'aten::mm') in the middle of, say, an optimizer step.
    absl::StrAppend(&report, where.bringing_back ? ", bringing back a result of '" : ", running '",
                    m.names[m.ops[where.op].name], "'");
    if (where.replaying != Engine::kNoKernel) {
      absl::StrAppend(&report, " and replaying '", m.names[m.ops[where.replaying].name], "' for it (", where.replays,
                      " replay(s) deep)");
    }
  }
  if (options.arena != nullptr && options.arena->stitched()) {
    // Stitching: no window is needed, only granules; what the evictable storages hold is what eviction can give.
    const ArenaStats a = options.arena->Stats();
    std::int64_t evictable = 0;
    for (const StorageIndex s : m.pool.Members()) evictable += m.storages[s].size;
    absl::StrAppend(&report, ", physical ", a.physical_bytes, " of ", a.physical_limit, " bytes mapped in ",
                    a.granule, "-byte granules, evictable ", evictable, " bytes");
  } else if (options.arena != nullptr) {
    std::size_t run = 0, largest = 0;
    options.arena->ForEachBlock([&](const BlockInfo& b) {
      const bool usable = b.free || (b.owner != kNoOwner && b.owner - 1 < m.storages.size() &&
                                     m.InPool(static_cast<StorageIndex>(b.owner - 1)));
      run = usable ? run + b.size : 0;
      largest = std::max(largest, run);
    });
    absl::StrAppend(&report, ", largest window of free or evictable blocks ", largest, " bytes");
  }
  return report;
}

std::int64_t MemoryReport::UnknownArenaBytes() const {
  const Engine::Impl& m = *engine_.impl_;
  const EngineOptions& options = engine_.options_;
  if (options.arena == nullptr) return 0;
  absl::flat_hash_set<std::uintptr_t> known;
  for (const GraphRecords::Storage& st : m.storages) {
    if (st.material && st.has_address) known.insert(st.address);
  }
  std::int64_t unknown = 0;
  options.arena->ForEachBlock([&](const BlockInfo& b) {
    if (!b.free && !known.contains(b.address)) unknown += static_cast<std::int64_t>(b.size);
  });
  return unknown;
}

}  // namespace remat
