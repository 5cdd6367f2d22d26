// Engine: the out-of-memory report (MemoryReport, WithMemoryReport): budget, bytes in use, locked by the running
// ops, constant and pinned bytes, where it ran out (the op and the replay chain) and, in arena mode, the largest run
// of free or evictable blocks.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/engine.h"
#include "runtime/engine_impl.h"

namespace remat {

// The executor's out-of-memory message, `context`, and the memory report, unless the message has it already (in
// arena mode the engine is the arena's pressure handler, and the arena adds DescribeMemory when it gives up).
absl::Status Engine::WithMemoryReport(absl::string_view message, absl::string_view context) const {
  if (absl::StrContains(message, kMemoryReportMarker)) {
    return absl::ResourceExhaustedError(absl::StrCat(message, context));
  }
  return absl::ResourceExhaustedError(absl::StrCat(message, context, "; ", MemoryReport()));
}

// Budget, bytes in use, locked and constant bytes, and in arena mode the largest run of free or evictable blocks
// (the largest window any eviction could have made), or with a stitching arena the physical bytes mapped and what
// the evictable storages hold.
std::string Engine::MemoryReport() const {
  const Impl& m = *impl_;
  std::int64_t locked = 0, pinned = 0, constant_in_arena = 0;
  for (const Impl::Storage& st : m.storages) {
    if (!st.material) continue;
    if (st.locks > 0 && !st.pinned) locked += st.size;
    if (st.pinned && !st.constant) pinned += st.size;
    if (st.constant && st.has_address) constant_in_arena += st.size;
  }
  std::string report = absl::StrFormat("budget %d, in use %d (%s %d, constant %d", options_.budget,
                                       stats_.used_bytes, kMemoryReportMarker, locked, m.constant_bytes);
  // Arena mode: constants made outside the arena (parameters made before remat) count in use but take no block;
  // results pinned for good (gradients and optimizer state once written) take blocks remat cannot evict.
  if (options_.arena != nullptr) absl::StrAppend(&report, " of which ", constant_in_arena, " in the arena");
  absl::StrAppend(&report, ", pinned results ", pinned);
  // Blocks of no storage the engine knows: the running kernels' own buffers, or memory made where remat cannot see.
  if (options_.arena != nullptr) absl::StrAppend(&report, ", in blocks remat does not know ", UnknownArenaBytes());
  absl::StrAppend(&report, ")");
  // Where it happened: the op the caller runs and, when it ran out while replaying, the innermost replay; or the
  // kernel running between BeginOp and EndOp.
  const Rematerializer::Where where = m.remat->where();
  if (where.op != kNoKernel && where.op < m.ops.size()) {
    absl::StrAppend(&report, ", running '", m.names[m.ops[where.op].name], "'");
    if (where.replaying != kNoKernel) {
      absl::StrAppend(&report, " and replaying '", m.names[m.ops[where.replaying].name], "' for it (", where.replays,
                      " replay(s) deep)");
    }
  }
  if (options_.arena != nullptr && options_.arena->stitched()) {
    // Stitching: no window is needed, only granules; what the evictable storages hold is what eviction can give.
    const ArenaStats a = options_.arena->Stats();
    std::int64_t evictable = 0;
    for (const StorageIndex s : m.pool.Members()) evictable += m.storages[s].size;
    absl::StrAppend(&report, ", physical ", a.physical_bytes, " of ", a.physical_limit, " bytes mapped in ",
                    a.granule, "-byte granules, evictable ", evictable, " bytes");
  } else if (options_.arena != nullptr) {
    std::size_t run = 0, largest = 0;
    options_.arena->ForEachBlock([&](const BlockInfo& b) {
      bool usable = b.free || (b.owner != kNoOwner && b.owner - 1 < m.storages.size() && m.InPool(static_cast<StorageIndex>(b.owner - 1)));
      run = usable ? run + b.size : 0;
      largest = std::max(largest, run);
    });
    absl::StrAppend(&report, ", largest window of free or evictable blocks ", largest, " bytes");
  }
  return report;
}

std::int64_t Engine::UnknownArenaBytes() const {
  const Impl& m = *impl_;
  if (options_.arena == nullptr) return 0;
  absl::flat_hash_set<std::uintptr_t> known;
  for (const Impl::Storage& st : m.storages) {
    if (st.material && st.has_address) known.insert(st.address);
  }
  std::int64_t unknown = 0;
  options_.arena->ForEachBlock([&](const BlockInfo& b) {
    if (!b.free && !known.contains(b.address)) unknown += static_cast<std::int64_t>(b.size);
  });
  return unknown;
}

}  // namespace remat
