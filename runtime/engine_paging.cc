// Engine: paging to a second tier (EngineOptions::paging): the link timeline, page-out and page-in of storages,
// prefetch, waiting for inputs, and paging the least recently used constant out (PageLruConstant).
#include "runtime/engine.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Ends the deferral a prefetch gave `s` (it goes back into the pool when it can be chosen there). `Records` is the
// engine's Impl (a template: the type is private to Engine).
template <typename Records>
void Unguard(Records& m, StorageIndex s) {
  auto it = std::find(m.prefetch_guard.begin(), m.prefetch_guard.end(), s);
  if (it == m.prefetch_guard.end()) return;
  m.prefetch_guard.erase(it);
  if (s >= m.storages.size()) return;
  GraphRecords::Storage& st = m.storages[s];
  st.deferred = false;  // its stale entry in deferred_list is skipped (ReleaseDeferred)
  if (st.material && st.locks == 0 && !st.pinned && !m.InPool(s)) m.PoolAppend(s);
}

}  // namespace

bool Engine::Paged(StorageIndex s) const { return impl_->storages[s].paged; }
std::int64_t Engine::ReadyAt(StorageIndex s) const { return impl_->storages[s].ready_at; }

bool Engine::PrefersPaging(StorageIndex s) const {
  const Impl& m = *impl_;
  const Impl::Storage& st = m.storages[s];
  const PagingOptions& p = options_.paging;
  if (p.mode == OffloadMode::kOff || st.dead) return false;  // nothing can need a dead storage again
  if (stats_.host_used_bytes > p.host_budget - st.size) return false;
  if (p.mode == OffloadMode::kAlways) return true;
  // Recompute cost including the evicted neighbours, as the policy sees them.
  std::int64_t neighbourhood = m.nb.regions() ? RegionCompute(s) : m.nb.eq_classes() ? EqClassCompute(s)
                                                                          : EvictedNeighbourCompute(s);
  const std::int64_t recompute = st.compute + neighbourhood;
  const std::int64_t backlog = std::max<std::int64_t>(0, link_.BusyUntil() - stats_.clock);
  const std::int64_t unhidden = backlog + 2 * link_.TransferNs(st.size);
  return unhidden < recompute;
}

absl::Status Engine::Reclaim(StorageIndex s) {
  if (PrefersPaging(s)) {
    absl::Status paged = PageOutStorage(s);
    if (!absl::IsNotFound(paged) && !absl::IsResourceExhausted(paged)) return paged;
    // Its bytes are gone already (executor.h, PageOut): nothing to page, so it is dropped. Or the second tier is
    // fuller than the engine's count says (a pinned pool's alignment and fragmentation): it is dropped instead.
  }
  return Evict(s);
}

absl::Status Engine::PageOut(StorageIndex s) {
  if (s >= impl_->storages.size()) return absl::InvalidArgumentError(absl::StrCat("no storage ", s));
  if (stats_.host_used_bytes > options_.paging.host_budget - impl_->storages[s].size) {
    return absl::ResourceExhaustedError(absl::StrCat("storage ", s, " does not fit the host budget"));
  }
  return PageOutStorage(s);
}

absl::Status Engine::PageOutStorage(StorageIndex s) {
  Impl& m = *impl_;
  Impl::Storage& st = m.storages[s];
  const bool pageable = st.material && !st.paged && !st.dead && !st.fixed &&
                        (st.pinned ? options_.paging.page_constants && st.locks == 1 : st.locks == 0);
  if (!pageable) return absl::FailedPreconditionError(absl::StrCat("storage ", s, " cannot be paged out"));
  if (absl::Status x = executor_->PageOut(*this, s); !x.ok()) return x;
  st.ready_at = link_.Issue(st.size, /*in=*/false, stats_.clock, 0);  // when the host copy is complete
  st.material = false;  // the region state keeps its material bit: a paged storage bounds evicted regions
  st.paged = true;
  m.nb.Touch(s);
  m.PoolRemove(s);
  for (TensorId t : st.tensors) {
    m.tensors[t].paged_defined = m.tensors[t].defined;
    m.tensors[t].defined = false;
  }
  st.has_address = false;
  m.page_order.NotePagedOut(s, KeyOf(m, s), [&m](std::uint32_t x, PageInOrder::Key key) {
    return x < m.storages.size() && m.storages[x].paged && KeyOf(m, x) == key;
  });
  stats_.used_bytes -= st.size;
  stats_.host_used_bytes += st.size;
  stats_.host_peak_bytes = std::max(stats_.host_peak_bytes, stats_.host_used_bytes);
  ++stats_.page_outs;
  stats_.paged_out_bytes += st.size;
  return absl::OkStatus();
}

absl::StatusOr<bool> Engine::PageInStorage(StorageIndex s, bool prefetch, bool may_reclaim) {
  Impl& m = *impl_;
  Impl::Storage& st = m.storages[s];
  if (!st.paged) return false;
  if (options_.mode == AccountingMode::kCounter) {
    if (!may_reclaim) {
      if (stats_.used_bytes + st.size > options_.budget) return false;
    } else if (absl::Status r = MakeRoomCounter(st.size, "page-in"); !r.ok()) {
      if (prefetch && absl::IsResourceExhausted(r)) return false;
      return r;
    }
  }
  no_reclaim_ = !may_reclaim;
  NoteAllocation();
  absl::Status x = prefetch ? executor_->PageInAhead(*this, s) : executor_->PageIn(*this, s);
  no_reclaim_ = false;
  if (!x.ok()) {
    if (!absl::IsResourceExhausted(x)) return x;  // the allocation's MakeRoom failed (a page-out), or the copy
    if (prefetch) return false;
    return WithMemoryReport(x.message(), absl::StrCat(" (paging in storage ", s, ")"));
  }
  st.ready_at = link_.Issue(st.size, /*in=*/true, stats_.clock, st.ready_at);  // after its own page-out
  st.paged = false;
  st.material = true;
  m.page_order.NotePagedBack();
  if (m.paged_in.size() <= s) m.paged_in.resize(m.storages.size(), false);
  m.paged_in[s] = true;
  m.nb.Touch(s);
  for (TensorId t : st.tensors) m.tensors[t].defined = m.tensors[t].paged_defined;
  stats_.used_bytes += st.size;
  stats_.host_used_bytes -= st.size;
  NotePeak();
  ++stats_.page_ins;
  stats_.paged_in_bytes += st.size;
  if (prefetch) {
    ++stats_.prefetches;
    m.SetLastAccess(s, stats_.clock);  // fresh: it is about to be used
  }
  if (st.locks == 0) m.PoolAppend(s);
  return true;
}

void Engine::DropPagedCopy(StorageIndex s) {
  Impl::Storage& st = impl_->storages[s];
  if (!st.paged) return;
  executor_->DropPaged(*this, s);
  st.paged = false;
  impl_->page_order.NotePagedBack();
  impl_->nb.Touch(s);
  stats_.host_used_bytes -= st.size;
}

absl::StatusOr<bool> Engine::Prefetch(TensorId t) {
  Impl& m = *impl_;
  if (t >= m.tensors.size()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", t));
  return PageInStorage(m.tensors[t].storage, /*prefetch=*/true, /*may_reclaim=*/false);
}

absl::StatusOr<int> Engine::PrefetchAhead(std::span<const TensorId> upcoming, bool make_room) {
  Impl& m = *impl_;
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
    absl::StatusOr<bool> in = PageInStorage(s, /*prefetch=*/true, /*may_reclaim=*/make_room);
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

void Engine::WaitForInputs(OpId op) {
  Impl& m = *impl_;
  std::int64_t ready = stats_.clock;
  const bool paging = options_.paging.mode != OffloadMode::kOff;
  for (TensorId p : m.Inputs(m.ops[op])) {
    const StorageIndex s = m.tensors[p].storage;
    ready = std::max(ready, m.storages[s].ready_at);
    if (!paging) continue;
    executor_->WillRead(*this, s);  // the kernel is ordered after a prefetch's copy
    if (s < m.paged_in.size() && m.paged_in[s]) {
      if (!m.prefetch_guard.empty()) Unguard(m, s);
      m.paged_in[s] = false;
      m.page_order.NoteRead(KeyOf(m, s));
    }
  }
  if (ready > stats_.clock) {
    stats_.stall_ns += ready - stats_.clock;
    stats_.clock = ready;
  }
  // An op the caller runs (BeginOp, not a replay inside another op): bring back what comes next while it runs.
  if (paging && options_.paging.prefetch && m.remat->GatheringCallersOp()) PrefetchForNextOps();
}

void Engine::PrefetchForNextOps() {
  Impl& m = *impl_;
  const PagingOptions& p = options_.paging;
  if (p.mode == OffloadMode::kOff || stats_.host_used_bytes == 0 || !p.prefetch) return;
  auto still_paged = [&m](std::uint32_t s, PageInOrder::Key key) {
    return s < m.storages.size() && m.storages[s].paged && !m.storages[s].dead && KeyOf(m, s) == key;
  };
  std::vector<std::int64_t> picks;
  for (const PageInOrder::Key& key : m.page_order.Next(kPrefetchDepth)) {  // the previous pass's order
    if (std::int64_t s = m.page_order.Take(key, still_paged); s >= 0) picks.push_back(s);
  }
  const bool learned = !picks.empty();
  if (!learned) {  // nothing known: the storage paged out last, into free memory only
    if (std::int64_t s = m.page_order.TakeMostRecent(still_paged); s >= 0) picks.push_back(s);
  }
  // The first one of a learned order may make room as the op would (the policy's victims: the op's inputs are
  // locked); the others only take memory nobody needs, leaving some of the budget free for the op's outputs.
  const std::int64_t headroom = options_.budget / kPrefetchHeadroomDivisor;
  bool first = learned;
  for (const std::int64_t s : picks) {
    const Impl::Storage& st = m.storages[s];
    if (!st.paged) continue;
    if (!first) {
      if (stats_.used_bytes + st.size > options_.budget - headroom) break;
      if (options_.mode == AccountingMode::kArena && options_.arena != nullptr &&
          options_.arena->Stats().largest_free_block < static_cast<std::size_t>(st.size + headroom)) {
        break;
      }
    }
    absl::StatusOr<bool> in = PageInStorage(static_cast<StorageIndex>(s), /*prefetch=*/true, /*may_reclaim=*/first);
    if (in.ok() && *in && !m.storages[s].deferred) {
      Impl::Storage& prefetched = m.storages[s];
      prefetched.deferred = true;
      if (m.InPool(s)) {
        m.PoolRemove(s);
        m.PoolAppend(s);  // into deferred_list
      }
      m.prefetch_guard.push_back(static_cast<StorageIndex>(s));
      if (m.prefetch_guard.size() > kPrefetchGuarded) Unguard(m, m.prefetch_guard.front());
    }
    first = false;
    if (!in.ok() || !*in) break;  // a prefetch that cannot happen is no error: the op pages in on demand
  }
}

absl::StatusOr<bool> Engine::PageLruConstant() {
  Impl& m = *impl_;
  const PagingOptions& p = options_.paging;
  if (p.mode == OffloadMode::kOff || !p.page_constants) return false;
  StorageIndex best = kNone;
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    const Impl::Storage& st = m.storages[s];
    if (!st.pinned || !st.material || st.paged || st.dead || st.fixed || st.locks != 1) continue;
    // Arena mode: a constant outside the arena (adopted without an address) frees nothing there.
    if (options_.mode == AccountingMode::kArena && !st.has_address) continue;
    if (stats_.host_used_bytes > p.host_budget - st.size) continue;
    if (best == kNone || st.last_access < m.storages[best].last_access) best = s;
  }
  if (best == kNone) return false;
  absl::Status paged = PageOutStorage(best);
  if (absl::IsNotFound(paged)) return false;  // its bytes are gone already (executor.h): no room made here
  if (!paged.ok()) return paged;
  return true;
}

}  // namespace remat
