// Engine::Impl: the engine's graph records (ops, tensors, storages, interned names, slots free for reuse), the
// rematerializer's frame stack and the scratch of one call, and the parts that own the rest of the state: the
// eviction pool (runtime/eviction_pool.h) and the neighbourhood costs (runtime/neighbourhood_costs.h). The small
// operations here keep the records and the parts in step (a storage joins the pool: its weight is marked; it
// becomes resident: the walks' mirror learns it). Internal to the engine's implementation files (engine*.cc);
// nothing else includes it. Hot paths are flat vectors indexed by dense ids.
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
#include "runtime/dense_scan.h"
#include "runtime/engine.h"
#include "runtime/eviction_pool.h"
#include "runtime/neighbourhood_costs.h"

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

struct Engine::Impl {
  struct Op {
    std::int64_t cost = 0;
    std::int64_t total_size = 0;
    std::uint32_t in_begin = 0, in_count = 0;
    std::uint32_t out_begin = 0, out_count = 0;
    std::uint32_t name = 0;  // index into names
    bool costly = false;
    // No output can ever be recomputed by it (each is dead or pinned): its input list is dropped (Recycle).
    bool inert = false;
    bool free = false;  // recycled: the slot waits for reuse
  };
  struct Tensor {
    OpId op = 0;
    std::uint32_t index = 0;
    StorageIndex storage = 0;
    std::int64_t size = 0;  // the op's size for this output (0 for views)
    std::int32_t ext_refs = 0;
    bool defined = false;
    bool alias = false;
    bool paged_defined = false;  // defined when its storage was paged out (restored on page-in)
    std::int32_t consumers = 0;  // ops (not inert) that list it as an input
  };
  struct Storage {
    std::int64_t size = 0;
    std::int64_t compute = 0;
    std::int64_t last_access = 0;
    std::int32_t locks = 0;
    std::int32_t ext_refs = 0;
    bool material = false;
    bool computed = false;  // has been computed at least once (evicted vs never produced)
    bool pinned = false;
    bool dead = false;  // free_dead: no reference and nothing alive can ever need it; out of the graph for good
    bool has_address = false;
    bool paged = false;     // on the second tier (not material; counts as material for regions and classes)
    bool constant = false;  // no producer (Constant, AdoptConstant, in-place write of a constant)
    bool deferred = false;  // Defer: kept out of the pool (in deferred_list) until the pool runs dry
    bool fixed = false;     // Fix: its address is known outside the engine; never moved, paged out or evicted
    bool free = false;      // recycled (also dead): the slot waits for reuse
    std::int64_t ready_at = 0;  // paged in: when the copy ends
    std::uintptr_t address = 0;
    std::vector<TensorId> tensors;
  };
  struct Frame {
    TensorId t;  // the tensor to (re)compute, or kNone: only gather and lock `op`'s inputs (BeginOp)
    OpId op;
    bool remat;
    std::uint8_t stage;
    std::uint32_t list_begin, list_end, next;
    std::uint32_t lock_begin = 0;  // this frame's entries in lock_log
  };

  std::vector<Op> ops;
  std::vector<TensorId> op_inputs, op_outputs;
  std::vector<Tensor> tensors;
  std::vector<Storage> storages;
  std::vector<std::string> names;
  absl::flat_hash_map<std::string, std::uint32_t> name_ids;
  EvictionPool pool;       // runtime/eviction_pool.h
  NeighbourhoodCosts nb;   // runtime/neighbourhood_costs.h: graph, regions, union-find, weight invalidation
  std::vector<StorageIndex> deferred_list;  // deferred storages that would be in the pool
  std::vector<Frame> stack;
  std::vector<TensorId> scratch;
  std::vector<StorageIndex> lock_log;  // locks taken by running frames, released in bulk if a call fails
  std::vector<StorageId> candidates;
  std::vector<std::uint32_t> fresh;
  std::vector<TensorId> dup;
  std::vector<StorageIndex> remat_storages;
  std::vector<StorageIndex> neighbours;
  std::mt19937_64 rng;
  std::int64_t constant_bytes = 0;

  // Recycling (engine_recycle.cc): slots of recycled ops, tensors and storages, reused before the tables grow;
  // storages that became dead or pinned and ops that may have become inert since the last Recycle; entries of
  // op_inputs/op_outputs no op uses any more (compacted when they outnumber the used ones).
  std::vector<OpId> free_ops;
  std::vector<TensorId> free_tensors;
  std::vector<StorageIndex> free_storages;
  std::vector<StorageIndex> settled;
  std::vector<OpId> recycle_ops;
  std::size_t io_garbage = 0;
  OpId open_op = kNone;  // between BeginOp and EndOp/AbortOp
  // A new op's slot (reused if one is free), its record reset.
  OpId NewOpSlot() {
    if (free_ops.empty()) {
      ops.emplace_back();
      return static_cast<OpId>(ops.size() - 1);
    }
    const OpId o = free_ops.back();
    free_ops.pop_back();
    ops[o] = Op{};
    return o;
  }
  TensorId NewTensorSlot() {
    if (free_tensors.empty()) {
      tensors.emplace_back();
      return static_cast<TensorId>(tensors.size() - 1);
    }
    const TensorId t = free_tensors.back();
    free_tensors.pop_back();
    tensors[t] = Tensor{};
    return t;
  }
  // A new storage's slot with every per-storage array reset (FreeStorage left them cleared).
  // A fresh record in slot s; its tensor list keeps its capacity (no allocation per new storage once slots recycle).
  void ResetStorage(StorageIndex s) {
    std::vector<TensorId> tensors = std::move(storages[s].tensors);
    tensors.clear();
    storages[s] = Storage{};
    storages[s].tensors = std::move(tensors);
  }
  StorageIndex NewStorageSlot() {
    if (free_storages.empty()) {
      storages.emplace_back();
      pool.Grow(storages.size());
      nb.AddSlot();
      return static_cast<StorageIndex>(storages.size() - 1);
    }
    const StorageIndex s = free_storages.back();
    free_storages.pop_back();
    ResetStorage(s);
    nb.ResetSlot(s);
    return s;
  }

  std::span<const TensorId> Inputs(const Op& op) const { return {op_inputs.data() + op.in_begin, op.in_count}; }
  std::span<const TensorId> Outputs(const Op& op) const {
    return {op_outputs.data() + op.out_begin, op.out_count};
  }

  std::uint32_t Name(std::string_view n) {
    auto it = name_ids.find(absl::string_view(n.data(), n.size()));
    if (it != name_ids.end()) return it->second;
    std::uint32_t id = static_cast<std::uint32_t>(names.size());
    names.emplace_back(n);
    name_ids.emplace(names.back(), id);
    return id;
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
