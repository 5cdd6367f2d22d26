// Engine::Impl: the engine's graph records (runtime/graph_records.h: ops, tensors, storages, names, slots) and the
// parts that own the rest of the state: the eviction pool (runtime/eviction_pool.h), the neighbourhood costs
// (runtime/neighbourhood_costs.h), the rematerializer, the pager, the pressure resolver and the defragmenter (their
// headers). The small operations here keep the records and the parts in step (a storage joins the pool: its weight is
// marked; it becomes resident: the walks' mirror learns it). Internal to the engine's implementation files; nothing
// else includes it. Hot paths are flat vectors indexed by dense ids.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/defragmenter.h"
#include "runtime/dense_scan.h"
#include "runtime/engine.h"
#include "runtime/eviction_pool.h"
#include "runtime/graph_records.h"
#include "runtime/neighbourhood_costs.h"
#include "runtime/pager.h"
#include "runtime/pressure_resolver.h"
#include "runtime/rematerializer.h"

namespace remat {
namespace engine_internal {

inline constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

inline std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace engine_internal

using engine_internal::kNone;
using engine_internal::NowNs;

struct Engine::Impl : GraphRecords {
  EvictionPool pool;       // runtime/eviction_pool.h
  NeighbourhoodCosts nb;   // runtime/neighbourhood_costs.h: graph, regions, union-find, weight invalidation
  // Made by Engine's constructor (they keep references to the engine):
  std::optional<Defragmenter> defrag;   // runtime/defragmenter.h: relocation, compaction
  std::optional<Rematerializer> remat;  // runtime/rematerializer.h: the frame stack, the running kernel
  std::optional<Pager> pager;           // runtime/pager.h: the second tier, the link, prefetch
  std::optional<PressureResolver> pressure;  // runtime/pressure_resolver.h: making room, the deferred reserve
  std::vector<StorageIndex> deferred_list;  // deferred storages that would be in the pool
  // Storages released with their memory kept (Storage::released_resident; stale entries are skipped): the first
  // victims of the next pressure event.
  std::vector<StorageIndex> released_list;
  // Per interned op name (GraphRecords::names): IsCostlyOp's answer, 0 not asked yet, 1 cheap, 2 costly. Asked once
  // per name rather than matched again on every op.
  std::vector<std::uint8_t> costly_by_name;
  std::vector<StorageId> candidates;
  std::vector<StorageIndex> remat_storages;
  std::vector<StorageIndex> neighbours;
  std::mt19937_64 rng;
  std::int64_t constant_bytes = 0;

  // Recycling (engine_recycle.cc): storages that became dead or pinned and ops that may have become inert since
  // the last Recycle.
  std::vector<StorageIndex> settled;
  std::vector<OpId> recycle_ops;
  OpId open_op = kNone;  // between BeginOp and EndOp/AbortOp
  // A new storage's slot (reused if one is free) with its record and the parts' entries reset.
  StorageIndex NewStorageSlot() {
    bool grew = false;
    const StorageIndex s = TakeStorageSlot(grew);
    if (grew) {
      pool.Grow(storages.size());
      nb.AddSlot();
    } else {
      nb.ResetSlot(s);
    }
    return s;
  }

  std::vector<double> chunk_min;     // the dense scan's scratch: minimum approximate score per chunk of slots
  // Per storage, during a window search: W / staleness, nullopt = barrier. Kept as optionals so the per-block
  // callback returns a copy from memory (building the optional in the callback stalls on store forwarding).
  std::vector<std::optional<double>> window_cost;

  void SetLastAccess(StorageIndex s, std::int64_t clock) {
    storages[s].last_access = clock;
    pool.SetLastAccess(s, clock);
  }
  bool InPool(StorageIndex s) const { return pool.Contains(s); }
  // reserve = false: into the pool even when deferred (ReleaseDeferred's one choice).
  void PoolAppend(StorageIndex s, bool reserve = true) {
    Storage& st = storages[s];
    if (pool.Contains(s)) return;
    if (reserve && st.deferred) {  // evictable, but only once the pool is empty (ReleaseDeferred); duplicates are harmless
      deferred_list.push_back(s);
      return;
    }
    pool.Append(s, st.last_access, st.size < 0);
    nb.JoinedPool(s, storages.size());
  }
  void PoolRemove(StorageIndex s) {
    if (!pool.Contains(s)) return;
    pool.Remove(s);
    nb.LeftPool(s);
  }

  void Lock(StorageIndex s) {
    Storage& st = storages[s];
    if (st.locks == 0) PoolRemove(s);
    ++st.locks;
  }
  void Unlock(StorageIndex s) {
    Storage& st = storages[s];
    if (--st.locks == 0 && st.material) PoolAppend(s);  // an in-place op may have turned it into an old value
  }

  // Excluded from evicted neighbourhoods (NeighbourhoodCosts): resident, paged or dead.
  bool OutOfNeighbourhood(StorageIndex n) const {
    const Storage& ns = storages[n];
    return ns.material || ns.paged || ns.dead;
  }
  // s is out of the graph for good: walks ignore it, the weights around it change, and Recycle may free its slot.
  void MarkDead(StorageIndex s) {
    storages[s].dead = true;
    settled.push_back(s);
    nb.MarkDead(s);
  }
  void SetMaterial(StorageIndex s, bool material) {
    storages[s].material = material;
    nb.SetMaterial(s, material);
  }
};

}  // namespace remat
