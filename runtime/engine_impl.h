// Engine::Impl: the engine's state (ops, tensors, storages, the eviction pool and its dense mirror, the regions
// and equivalence classes of the policies' neighbourhood costs) and the small operations on it. Internal to the
// engine's implementation files (engine.cc, engine_room.cc, engine_paging.cc, engine_choice.cc); nothing else
// includes it.
//
// Engine implementation. Hot paths are flat vectors indexed by dense ids; the eviction pool is an intrusive
// doubly-linked list in insertion order (lock removes, unlock appends), which is what the prototype's tie-breaking
// depends on. The pool is mirrored in dense arrays (struct of arrays, arbitrary slot order: swap-remove) carrying
// each candidate's insertion sequence number, last access and the policy's staleness weight W (see
// Policy::HasStalenessWeight), so a full scan is a tight loop over contiguous doubles; the sequence numbers give
// back the pool order for ties and the early stop.
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
#include "runtime/eq_classes.h"
#include "runtime/eviction_pool.h"
#include "runtime/regions.h"

namespace remat {
namespace engine_internal {

inline constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

inline std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Empties a list that a recycled slot will fill again: a short one keeps its capacity (no allocation when the slot
// is reused), a long one (a weight every op read) gives its memory back.
template <typename T>
void KeepSmallCapacity(std::vector<T>& v) {
  if (v.capacity() > 64) {
    std::vector<T>().swap(v);
  } else {
    v.clear();
  }
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
    std::int32_t ecn = -1;  // union-find node, -1 = none (resident)
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
  std::vector<Region> fwd, rev;  // per storage, when regions are on
  EqClasses eq;
  EvictionPool pool;  // runtime/eviction_pool.h
  std::vector<StorageIndex> deferred_list;  // deferred storages that would be in the pool
  std::vector<Frame> stack;
  std::vector<TensorId> scratch;
  std::vector<StorageIndex> lock_log;  // locks taken by running frames, released in bulk if a call fails
  std::vector<StorageId> candidates;
  std::vector<std::uint32_t> fresh;
  std::vector<TensorId> dup;
  std::vector<StorageIndex> remat_storages;
  absl::flat_hash_set<StorageIndex> affected, affected_rev;
  std::vector<StorageIndex> dfs;
  std::vector<StorageIndex> neighbours;
  std::vector<std::int32_t> roots;
  std::mt19937_64 rng;
  bool regions = false;
  bool eq_classes = false;
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
      storage_parents.emplace_back();
      storage_children.emplace_back();
      state.push_back(0);
      costs.push_back(0);
      weight_mark.push_back(kOut);
      if (regions) {
        fwd.emplace_back();
        rev.emplace_back();
      }
      return static_cast<StorageIndex>(storages.size() - 1);
    }
    const StorageIndex s = free_storages.back();
    free_storages.pop_back();
    ResetStorage(s);
    state[s] = 0;
    costs[s] = 0;
    weight_mark[s] = kOut;
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
  // Staleness weights: maintained when the policy has them (Policy::HasStalenessWeight). Only pool members'
  // weights matter (joining the pool marks one dirty), so weight_mark per storage is kOut (not in the pool),
  // kClean or kDirty (queued in `dirty`, recomputed at the next choice). `all_dirty` recomputes every pool member
  // (a union-find class too large to walk changed, or the queue outgrew the storages).
  static constexpr std::uint8_t kOut = 0, kClean = 1, kDirty = 2;
  bool weights = false;
  bool all_dirty = false;
  std::vector<std::uint8_t> weight_mark;
  std::vector<StorageIndex> dirty;
  // Per storage, during a window search: W / staleness, nullopt = barrier. Kept as optionals so the per-block
  // callback returns a copy from memory (building the optional in the callback stalls on store forwarding).
  std::vector<std::optional<double>> window_cost;

  void MarkDirty(StorageIndex x) {
    if (weight_mark[x] != kClean) return;
    weight_mark[x] = kDirty;
    dirty.push_back(x);
  }
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
    if (weights) {
      weight_mark[s] = kDirty;
      if (dirty.size() > 2 * storages.size()) {  // no choice for a long while: recompute everything instead
        dirty.clear();
        all_dirty = true;
      }
      if (!all_dirty) dirty.push_back(s);
    }
  }
  void PoolRemove(StorageIndex s) {
    if (!pool.Contains(s)) return;
    pool.Remove(s);
    if (weights) weight_mark[s] = kOut;
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

  // Storages of s's tensors' parents and children that are not material (excluding s), deduplicated. Uses the
  // storage-level adjacency (always maintained): fewer indirections than walking tensors and ops.
  void NonMaterialNeighbours(StorageIndex s, std::vector<StorageIndex>& out) const {
    out.clear();
    auto add = [&](StorageIndex n) {
      if (n == s || storages[n].material || storages[n].paged || storages[n].dead) return;
      for (StorageIndex x : out) {
        if (x == n) return;
      }
      out.push_back(n);
    };
    for (StorageIndex n : storage_parents[s]) add(n);
    for (StorageIndex n : storage_children[s]) add(n);
  }

  // Summed value of the distinct union-find classes of s's non-material neighbours (EqClassCompute), in one pass
  // without building the neighbour list: a neighbour met twice has the same root, so deduplicating roots is enough.
  std::int64_t EqSum(StorageIndex s) {
    std::int32_t local[16];
    std::size_t count = 0;
    roots.clear();
    std::int64_t sum = 0;
    auto visit = [&](StorageIndex n) {
      const Storage& ns = storages[n];
      if (n == s || ns.material || ns.paged || ns.dead || ns.ecn < 0) return;
      std::int32_t r = eq.Find(ns.ecn);
      for (std::size_t k = 0; k < count; ++k) {
        if (local[k] == r) return;
      }
      for (std::int32_t x : roots) {
        if (x == r) return;
      }
      if (count < 16) local[count++] = r; else roots.push_back(r);
      sum += eq.RootValue(r);
    };
    for (StorageIndex n : storage_parents[s]) visit(n);
    for (StorageIndex n : storage_children[s]) visit(n);
    return sum;
  }

  // Regions (runtime/regions.h) over the storage-level adjacency. Regions of pinned storages are never read (a
  // pinned storage is never scored nor evicted), so they are not maintained.
  std::vector<std::vector<StorageIndex>> storage_parents, storage_children;
  // Compact mirrors of Storage::material/dead and Storage::compute for the walks (cache-friendly).
  std::vector<std::uint8_t> state;
  std::vector<std::int64_t> costs;
  RegionWalker walker;
  // Staleness-weight invalidation. A weight depends on the storage's bytes and compute, its neighbours' status,
  // compute and union-find classes (EqClassCompute, EvictedNeighbourCompute). Any change that can alter them for x
  // marks x dirty: a storage's own status/ecn/edges/compute (Touch: x and its neighbours) and a union-find class's
  // value or membership (TouchClass: the neighbours of every storage whose current node is in the class; past
  // kClassTouchLimit such nodes or a quarter of the pool, every weight at once). Marking is lazy (recomputed at the next choice), so
  // over-invalidating is always safe.
  static constexpr std::size_t kClassTouchLimit = 256;
  std::vector<StorageIndex> node_storage;               // per union-find node: its storage
  std::vector<std::vector<std::int32_t>> node_members;  // per root: the nodes of its class (some no longer current)
  std::vector<std::int32_t> node_live;                  // per root: the current nodes of its class
  void Touch(StorageIndex x) {
    if (!weights || all_dirty) return;  // every weight is recomputed at the next choice anyway
    MarkDirty(x);
    for (StorageIndex n : storage_parents[x]) MarkDirty(n);
    for (StorageIndex n : storage_children[x]) MarkDirty(n);
  }
  void TouchClass(std::int32_t node) {
    if (!weights || all_dirty) return;
    const std::int32_t root = eq.Find(node);
    // Walking the class costs about as much per member as recomputing one weight: past a quarter of the pool (or
    // kClassTouchLimit), recomputing every weight once at the next choice is cheaper.
    const std::size_t live = static_cast<std::size_t>(node_live[root]);
    if (live > kClassTouchLimit || live * 4 > pool.size()) {
      all_dirty = true;
      return;
    }
    // Only the current nodes matter: a storage that left its node (resident again) never returns to it, and EqSum
    // only reaches classes through current nodes. Drop the others for good (each node once: amortized O(1)).
    std::vector<std::int32_t>& members = node_members[root];
    std::erase_if(members, [&](std::int32_t x) { return storages[node_storage[x]].ecn != x; });
    for (std::int32_t x : members) Touch(node_storage[x]);
  }
  std::int32_t EqAdd(StorageIndex s, std::int64_t value) {
    std::int32_t node = eq.Add(value);
    node_storage.push_back(s);
    node_members.emplace_back(1, node);
    node_live.push_back(1);
    return node;
  }
  // s's storage leaves its union-find node (it is resident again): the node stays in its class, no longer current.
  void LeaveNode(StorageIndex s) {
    Storage& st = storages[s];
    if (st.ecn < 0) return;
    --node_live[eq.Find(st.ecn)];
    st.ecn = -1;
  }
  void EqMerge(std::int32_t joining, std::int32_t into) {
    std::int32_t l = eq.Find(joining), r = eq.Find(into);
    if (l == r) return;
    std::vector<std::int32_t>& big = node_members[r];
    std::vector<std::int32_t>& small = node_members[l];
    if (small.size() > big.size()) big.swap(small);
    big.insert(big.end(), small.begin(), small.end());
    std::vector<std::int32_t>().swap(small);
    node_live[r] += node_live[l];
    eq.Merge(joining, into);  // r stays the root
  }

  // s is out of the graph for good: walks ignore it, the weights around it change, and Recycle may free its slot.
  void MarkDead(StorageIndex s) {
    storages[s].dead = true;
    settled.push_back(s);
    Touch(s);
    state[s] |= kRegionDead;
  }

  void SetMaterial(StorageIndex s, bool material) {
    Touch(s);
    storages[s].material = material;
    state[s] = static_cast<std::uint8_t>((state[s] & ~kRegionMaterial) | (material ? kRegionMaterial : 0));
  }
  void Absorb(Region& region, StorageIndex s, bool reverse) {
    walker.Absorb(region, reverse ? rev[s] : fwd[s], s, costs);
  }
  void Rebuild(StorageIndex base, bool reverse) {
    walker.Rebuild(reverse ? rev[base] : fwd[base], base, reverse ? storage_parents : storage_children, state,
                   costs);
  }
};

}  // namespace remat
