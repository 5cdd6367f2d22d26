// Pager: the second tier: the drop-or-page choice, page-out, page-in, prefetch, waiting for inputs, paging the least
// recently used constant out (pager.h).
#include "runtime/pager.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/memory_report.h"
#include "runtime/engine_impl.h"

namespace remat {
namespace {

// Prefetch (PrefetchForNextOps): how many paged storages to bring back ahead of each op, and the share of the budget
// the ones after the first must leave free (the op's own outputs need room).
constexpr int kPrefetchDepth = 2;
constexpr std::int64_t kPrefetchHeadroomDivisor = 8;
// Prefetched storages not read yet are deferred (the policy takes them only when nothing else is left), at most this
// many at a time: a wrong guess must not hold memory for long.
constexpr std::size_t kPrefetchGuarded = 4;

PageInOrder::Key KeyOf(const GraphRecords& m, StorageIndex s) {
  const auto& st = m.storages[s];
  if (st.constant || st.tensors.empty()) return {0, st.size, s + 1};
  return {m.ops[m.tensors[st.tensors[0]].op].name + 1, st.size, 0};
}

}  // namespace

Pager::Pager(Engine& engine, const PagingOptions& options) : engine_(engine), link_(options) {}

void Pager::Unguard(StorageIndex s) {
  Engine::Impl& m = *engine_.impl_;
  auto it = std::find(prefetch_guard_.begin(), prefetch_guard_.end(), s);
  if (it == prefetch_guard_.end()) return;
  prefetch_guard_.erase(it);
  if (s >= m.storages.size()) return;
  GraphRecords::Storage& st = m.storages[s];
  st.deferred = false;  // its stale entry in deferred_list is skipped (ReleaseDeferred)
  if (st.material && st.locks == 0 && !st.pinned && !m.InPool(s)) m.PoolAppend(s);
}

bool Pager::PrefersPaging(StorageIndex s) const {
  const Engine::Impl& m = *engine_.impl_;
  const GraphRecords::Storage& st = m.storages[s];
  const PagingOptions& p = engine_.options_.paging;
  const EngineStats& stats = engine_.stats_;
  if (p.mode == OffloadMode::kOff || st.dead) return false;  // nothing can need a dead storage again
  if (stats.host_used_bytes > p.host_budget - st.size) return false;
  if (p.mode == OffloadMode::kAlways) return true;
  // Recompute cost including the evicted neighbours, as the policy sees them.
  const Engine& e = engine_;
  std::int64_t neighbourhood = m.nb.regions() ? e.RegionCompute(s) : m.nb.eq_classes() ? e.EqClassCompute(s)
                                                                                  : e.EvictedNeighbourCompute(s);
  const std::int64_t recompute = st.compute + neighbourhood;
  const std::int64_t backlog = std::max<std::int64_t>(0, link_.BusyUntil() - stats.clock);
  const std::int64_t unhidden = backlog + 2 * link_.TransferNs(st.size);
  return unhidden < recompute;
}

absl::Status Pager::Reclaim(StorageIndex s) {
  if (PrefersPaging(s)) {
    absl::Status paged = PageOut(s);
    if (!absl::IsNotFound(paged) && !absl::IsResourceExhausted(paged)) return paged;
    // Its bytes are gone already (executor.h, PageOut): nothing to page, so it is dropped. Or the second tier is
    // fuller than the engine's count says (a pinned pool's alignment and fragmentation): it is dropped instead.
  }
  return engine_.Evict(s);
}

absl::Status Pager::PageOut(StorageIndex s) {
  Engine::Impl& m = *engine_.impl_;
  EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  GraphRecords::Storage& st = m.storages[s];
  const bool pageable = st.material && !st.paged && !st.dead && !st.fixed &&
                        (st.pinned ? options.paging.page_constants && st.locks == 1 : st.locks == 0);
  if (!pageable) return absl::FailedPreconditionError(absl::StrCat("storage ", s, " cannot be paged out"));
  if (absl::Status x = engine_.executor_->PageOut(engine_, s); !x.ok()) return x;
  st.ready_at = link_.Issue(st.size, /*in=*/false, stats.clock, 0);  // when the host copy is complete
  st.material = false;  // the region state keeps its material bit: a paged storage bounds evicted regions
  st.paged = true;
  m.nb.Touch(s);
  m.PoolRemove(s);
  for (TensorId t : st.tensors) {
    m.tensors[t].paged_defined = m.tensors[t].defined;
    m.tensors[t].defined = false;
  }
  st.has_address = false;
  page_order_.NotePagedOut(s, KeyOf(m, s), [&m](std::uint32_t x, PageInOrder::Key key) {
    return x < m.storages.size() && m.storages[x].paged && KeyOf(m, x) == key;
  });
  stats.used_bytes -= st.size;
  stats.host_used_bytes += st.size;
  stats.host_peak_bytes = std::max(stats.host_peak_bytes, stats.host_used_bytes);
  ++stats.page_outs;
  stats.paged_out_bytes += st.size;
  return absl::OkStatus();
}

absl::StatusOr<bool> Pager::PageIn(StorageIndex s, bool prefetch, bool may_reclaim) {
  Engine::Impl& m = *engine_.impl_;
  EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  GraphRecords::Storage& st = m.storages[s];
  if (!st.paged) return false;
  if (options.mode == AccountingMode::kCounter) {
    if (!may_reclaim) {
      if (stats.used_bytes + st.size > options.budget) return false;
    } else if (absl::Status r = m.pressure->MakeRoomCounter(st.size, "page-in"); !r.ok()) {
      if (prefetch && absl::IsResourceExhausted(r)) return false;
      return r;
    }
  }
  prefetching_ = !may_reclaim;
  engine_.NoteAllocation();
  absl::Status x = prefetch ? engine_.executor_->PageInAhead(engine_, s) : engine_.executor_->PageIn(engine_, s);
  prefetching_ = false;
  if (!x.ok()) {
    if (!absl::IsResourceExhausted(x)) return x;  // the allocation's MakeRoom failed (a page-out), or the copy
    if (prefetch) return false;
    return MemoryReport(engine_).Annotate(x.message(), absl::StrCat(" (paging in storage ", s, ")"));
  }
  st.ready_at = link_.Issue(st.size, /*in=*/true, stats.clock, st.ready_at);  // after its own page-out
  st.paged = false;
  st.material = true;
  page_order_.NotePagedBack();
  if (paged_in_.size() <= s) paged_in_.resize(m.storages.size(), false);
  paged_in_[s] = true;
  m.nb.Touch(s);
  for (TensorId t : st.tensors) m.tensors[t].defined = m.tensors[t].paged_defined;
  stats.used_bytes += st.size;
  stats.host_used_bytes -= st.size;
  engine_.NotePeak();
  ++stats.page_ins;
  stats.paged_in_bytes += st.size;
  if (prefetch) {
    ++stats.prefetches;
    m.SetLastAccess(s, stats.clock);  // fresh: it is about to be used
  }
  if (st.locks == 0) m.PoolAppend(s);
  return true;
}

void Pager::DropCopy(StorageIndex s) {
  Engine::Impl& m = *engine_.impl_;
  GraphRecords::Storage& st = m.storages[s];
  if (!st.paged) return;
  engine_.executor_->DropPaged(engine_, s);
  st.paged = false;
  page_order_.NotePagedBack();
  m.nb.Touch(s);
  engine_.stats_.host_used_bytes -= st.size;
}

absl::StatusOr<int> Pager::PrefetchAhead(std::span<const TensorId> upcoming, bool make_room) {
  Engine::Impl& m = *engine_.impl_;
  std::vector<StorageIndex> held;  // what the upcoming ops read and is resident: not a victim meanwhile
  for (TensorId t : upcoming) {
    if (t >= m.tensors.size()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", t));
    StorageIndex s = m.tensors[t].storage;
    if (m.storages[s].material) {
      m.Lock(s);
      held.push_back(s);
    }
  }
  int issued = 0;
  absl::Status error;
  for (TensorId t : upcoming) {
    StorageIndex s = m.tensors[t].storage;
    if (!m.storages[s].paged) continue;
    absl::StatusOr<bool> in = PageIn(s, /*prefetch=*/true, /*may_reclaim=*/make_room);
    if (!in.ok()) {
      error = in.status();
      break;
    }
    if (!*in) break;  // no room: the later ones are needed later still
    ++issued;
    m.Lock(s);
    held.push_back(s);
  }
  for (StorageIndex s : held) m.Unlock(s);
  if (!error.ok()) return error;
  return issued;
}

void Pager::WaitForInputs(OpId op) {
  Engine::Impl& m = *engine_.impl_;
  EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  std::int64_t ready = stats.clock;
  const bool paging = options.paging.mode != OffloadMode::kOff;
  for (TensorId p : m.Inputs(m.ops[op])) {
    const StorageIndex s = m.tensors[p].storage;
    ready = std::max(ready, m.storages[s].ready_at);
    if (!paging) continue;
    engine_.executor_->WillRead(engine_, s);  // the kernel is ordered after a prefetch's copy
    if (s < paged_in_.size() && paged_in_[s]) {
      if (!prefetch_guard_.empty()) Unguard(s);
      paged_in_[s] = false;
      page_order_.NoteRead(KeyOf(m, s));
    }
  }
  if (ready > stats.clock) {
    stats.stall_ns += ready - stats.clock;
    stats.clock = ready;
  }
  // An op the caller runs (BeginOp, not a replay inside another op): bring back what comes next while it runs.
  if (paging && options.paging.prefetch && m.remat->GatheringCallersOp()) PrefetchForNextOps();
}

void Pager::PrefetchForNextOps() {
  Engine::Impl& m = *engine_.impl_;
  const EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  const PagingOptions& p = options.paging;
  if (p.mode == OffloadMode::kOff || stats.host_used_bytes == 0 || !p.prefetch) return;
  auto still_paged = [&m](std::uint32_t s, PageInOrder::Key key) {
    return s < m.storages.size() && m.storages[s].paged && !m.storages[s].dead && KeyOf(m, s) == key;
  };
  std::vector<std::int64_t> picks;
  for (const PageInOrder::Key& key : page_order_.Next(kPrefetchDepth)) {  // the previous pass's order
    if (std::int64_t s = page_order_.Take(key, still_paged); s >= 0) picks.push_back(s);
  }
  const bool learned = !picks.empty();
  if (!learned) {  // nothing known: the storage paged out last, into free memory only
    if (std::int64_t s = page_order_.TakeMostRecent(still_paged); s >= 0) picks.push_back(s);
  }
  // The first one of a learned order may make room as the op would (the policy's victims: the op's inputs are
  // locked); the others only take memory nobody needs, leaving some of the budget free for the op's outputs.
  const std::int64_t headroom = options.budget / kPrefetchHeadroomDivisor;
  bool first = learned;
  for (const std::int64_t s : picks) {
    const GraphRecords::Storage& st = m.storages[s];
    if (!st.paged) continue;
    if (!first) {
      if (stats.used_bytes + st.size > options.budget - headroom) break;
      if (options.mode == AccountingMode::kArena && options.arena != nullptr &&
          options.arena->Stats().largest_free_block < static_cast<std::size_t>(st.size + headroom)) {
        break;
      }
    }
    absl::StatusOr<bool> in = PageIn(static_cast<StorageIndex>(s), /*prefetch=*/true, /*may_reclaim=*/first);
    if (in.ok() && *in && !m.storages[s].deferred) {
      GraphRecords::Storage& prefetched = m.storages[s];
      prefetched.deferred = true;
      if (m.InPool(s)) {
        m.PoolRemove(s);
        m.PoolAppend(s);  // into deferred_list
      }
      prefetch_guard_.push_back(static_cast<StorageIndex>(s));
      if (prefetch_guard_.size() > kPrefetchGuarded) Unguard(prefetch_guard_.front());
    }
    first = false;
    if (!in.ok() || !*in) break;  // a prefetch that cannot happen is no error: the op pages in on demand
  }
}

absl::StatusOr<bool> Pager::PageLruConstant() {
  const Engine::Impl& m = *engine_.impl_;
  const EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  const PagingOptions& p = options.paging;
  if (p.mode == OffloadMode::kOff || !p.page_constants) return false;
  StorageIndex best = kNone;
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    const GraphRecords::Storage& st = m.storages[s];
    if (!st.pinned || !st.material || st.paged || st.dead || st.fixed || st.locks != 1) continue;
    // Arena mode: a constant outside the arena (adopted without an address) frees nothing there.
    if (options.mode == AccountingMode::kArena && !st.has_address) continue;
    if (stats.host_used_bytes > p.host_budget - st.size) continue;
    if (best == kNone || st.last_access < m.storages[best].last_access) best = s;
  }
  if (best == kNone) return false;
  absl::Status paged = PageOut(best);
  if (absl::IsNotFound(paged)) return false;  // its bytes are gone already (executor.h): no room made here
  if (!paged.ok()) return paged;
  return true;
}

}  // namespace remat
