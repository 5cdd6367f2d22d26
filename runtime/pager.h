// Pager: the second tier (engine.h, "Paging"; DESIGN.md "Offloading"). It decides per victim whether to drop it or
// page it out (PrefersPaging: the transfer time that cannot be hidden against the recompute cost the policy sees),
// pages storages out and in through the executor, keeps the copies' timeline (runtime/link_model.h), makes an op
// wait for its inputs' page-ins (stall), prefetches what the last pass read next (runtime/page_in_order.h), and
// as a last resort pages out the least recently used constant. With paging off it pages nothing and only waits for
// nothing: the engine behaves as without a second tier.
//
// It owns the link model, the page-in order, which storages were paged in and not read since, the prefetched
// storages it keeps deferred until read, and whether a prefetch is allocating now (then MakeRoom must not evict).
// The records, the pool, the stats and the steps it needs from the engine (dropping a victim, counter-mode room,
// the memory report) are the engine's, reached through it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/engine.h"
#include "runtime/link_model.h"
#include "runtime/page_in_order.h"

namespace remat {

class Pager {
 public:
  Pager(Engine& engine, const PagingOptions& options);

  // Whether victim s should be paged out rather than dropped (engine.h, "Paging").
  bool PrefersPaging(StorageIndex s) const;
  // Pages victim s out when PrefersPaging says so and the tier takes it, else drops it (Engine::Evict).
  absl::Status Reclaim(StorageIndex s);
  // Pages resident s out; FailedPrecondition when s cannot be (locked, fixed, dead, pinned without page_constants).
  absl::Status PageOut(StorageIndex s);
  // Brings paged s back; the allocation may reclaim other storages when `may_reclaim`. With `prefetch`, lack of
  // memory is not an error (returns false), and s counts as a prefetch and is marked fresh. False if s is not paged.
  absl::StatusOr<bool> PageIn(StorageIndex s, bool prefetch, bool may_reclaim);
  // s was recomputed or died: its host copy is dropped.
  void DropCopy(StorageIndex s);
  // Engine::PrefetchAhead.
  absl::StatusOr<int> PrefetchAhead(std::span<const TensorId> upcoming, bool make_room);
  // Waits (advancing the clock, counting stall) until the inputs of `op` are on the device; for an op the caller
  // runs, prefetches what comes next (PagingOptions::prefetch).
  void WaitForInputs(OpId op);
  // page_constants: pages the least recently used constant held only by its pin. False if none fits.
  absl::StatusOr<bool> PageLruConstant();

  // A prefetch is allocating: making room must not evict for it.
  bool prefetching() const { return prefetching_; }
  const LinkModel& link() const { return link_; }

 private:
  void PrefetchForNextOps();
  // Ends the deferral a prefetch gave s (it goes back into the pool when it can be chosen there).
  void Unguard(StorageIndex s);

  Engine& engine_;
  LinkModel link_;         // the copies' timeline
  PageInOrder page_order_;  // what to prefetch next
  std::vector<bool> paged_in_;  // by storage: paged in and not read since (its read teaches page_order_)
  std::vector<StorageIndex> prefetch_guard_;  // prefetched, deferred until read, oldest first
  bool prefetching_ = false;
};

}  // namespace remat
