// NeighbourhoodCosts: what the policies' neighbourhood terms read, kept incrementally by the engine's events
// (engine_impl.h owns one). Storages are known by slot index only; whether a storage counts as evicted is the
// engine's to say (an `excluded` predicate: resident, paged or dead storages are not part of an evicted
// neighbourhood), the rest is owned here:
//   - the storage-level graph: each storage's parents and children (repeats allowed; the walks mark visits), and
//     compact mirrors of each storage's state (kRegionMaterial, kRegionDead) and compute for the walks;
//   - regions (h_DTR, MSPS; runtime/regions.h): each storage's forward and backward evicted region, absorbed on
//     eviction and rebuilt around storages that become resident, exactly as the DTR prototype's simulator does;
//   - union-find classes (h_DTR^eq; runtime/eq_classes.h): each evicted storage's current node, classes merged on
//     eviction, a class's value lowered when a member comes back; nodes compacted when they outnumber storages;
//   - staleness weights' invalidation (Policy::HasStalenessWeight): a weight depends on the storage's bytes and
//     compute, its neighbours' status, compute and classes. Any change that can alter them for x marks x dirty
//     (Touch: x and its neighbours; TouchClass: the neighbours of every storage whose current node is in the class,
//     or every weight at once past a limit). Marking is lazy (RefreshWeights recomputes at the next choice), so
//     over-invalidating is always safe. Only pool members' weights matter (joining the pool marks one dirty).
// Each part is off unless Configure turns it on (the policy's features); the graph and mirrors are always kept.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "runtime/eq_classes.h"
#include "runtime/eviction_pool.h"
#include "runtime/regions.h"

namespace remat {

class NeighbourhoodCosts {
 public:
  using Slot = StorageIndex;

  void Configure(bool regions, bool eq_classes, bool weights) {
    regions_ = regions;
    eq_classes_ = eq_classes;
    weights_ = weights;
  }
  bool regions() const { return regions_; }
  bool eq_classes() const { return eq_classes_; }
  bool weights() const { return weights_; }

  // Slots. AddSlot: the engine's storage table grew by one. ResetSlot: a recycled slot is reused (as new).
  // FreeSlot: a dead storage with no tensor left is recycled (its node left, regions cleared, dead to walks); its
  // adjacency lists stay until DetachFreed, called once for every slot freed by one Recycle.
  void AddSlot();
  void ResetSlot(Slot s);
  void FreeSlot(Slot s);
  // The freed slots leave their neighbours' lists: one pass per neighbour (a weight read by every op lists each
  // of them: erasing one by one would be quadratic). `is_free(x)`: x is a freed slot.
  template <typename IsFree>
  void DetachFreed(std::span<const Slot> freed, IsFree is_free);

  // The graph. AddEdge: `child` is computed from `parent` (both touched).
  void AddEdge(Slot child, Slot parent);
  std::span<const Slot> Parents(Slot s) const { return parents_[s]; }
  std::span<const Slot> Children(Slot s) const { return children_[s]; }
  void AddCompute(Slot s, std::int64_t cost) { costs_[s] += cost; }
  // s became resident or not (the mirror; touched). A paged storage keeps its material bit: it bounds regions.
  void SetMaterial(Slot s, bool material);
  // s is out of the graph for good: walks ignore it and the weights around it change.
  void MarkDead(Slot s);

  // Regions.
  const Region& Forward(Slot s) const { return fwd_[s]; }
  const Region& Backward(Slot s) const { return rev_[s]; }
  // s was just evicted: its neighbours' regions absorb it (except pinned ones', never read), its own are cleared.
  template <typename IsPinned>
  void AbsorbEvicted(Slot s, IsPinned is_pinned);
  // `resident` just became resident: their regions and those of the storages at their regions' frontiers
  // (except pinned ones) are rebuilt.
  template <typename IsPinned>
  void RebuildAround(std::span<const Slot> resident, IsPinned is_pinned);

  // Union-find classes. NewStorage: a placeholder node for a storage never computed yet. Evicted: s (of
  // `compute`) gets a node merged with its evicted neighbours' classes. Resident: s is back, its class loses its
  // compute. `pool_size` bounds the invalidation walk (TouchClass).
  void NewStorage(Slot s);
  template <typename Excluded>
  void Evicted(Slot s, std::int64_t compute, std::size_t pool_size, Excluded excluded);
  void Resident(Slot s, std::int64_t compute, std::size_t pool_size);
  // s leaves its node (resident again, or freed): the node stays in its class, no longer current.
  void LeaveNode(Slot s);
  // Summed value of the distinct classes of s's evicted neighbours (EqClassCompute).
  template <typename Excluded>
  std::int64_t EqSum(Slot s, Excluded excluded);
  // Rebuilds the union-find once its nodes outnumber `storage_count` twice over (and `floor`): one node per
  // storage that has a current node, classes and values kept exactly (no score changes). Dead storages lose theirs.
  template <typename IsDead>
  void MaybeCompactClasses(std::size_t floor, std::size_t storage_count, IsDead is_dead);
  std::size_t union_find_nodes() const { return eq_.size(); }

  // Staleness weights.
  void Touch(Slot s);
  void JoinedPool(Slot s, std::size_t storage_count);
  void LeftPool(Slot s) {
    if (weights_) weight_mark_[s] = kOut;
  }
  // Recomputes the pool members' weights marked dirty (all of them when everything is): weight_of(s).
  template <typename WeightOf>
  void RefreshWeights(EvictionPool& pool, WeightOf weight_of);

 private:
  static constexpr std::uint8_t kOut = 0, kClean = 1, kDirty = 2;
  // Walking a class costs about as much per member as recomputing one weight: past this many current nodes (or a
  // quarter of the pool), every weight is recomputed once instead.
  static constexpr std::size_t kClassTouchLimit = 256;
  void MarkDirty(Slot x) {
    if (weight_mark_[x] != kClean) return;
    weight_mark_[x] = kDirty;
    dirty_.push_back(x);
  }
  void TouchClass(std::int32_t node, std::size_t pool_size);
  std::int32_t AddNode(Slot s, std::int64_t value);
  void MergeNodes(std::int32_t joining, std::int32_t into);

  bool regions_ = false, eq_classes_ = false, weights_ = false;
  // The graph and its mirrors.
  std::vector<std::vector<Slot>> parents_, children_;
  std::vector<std::uint8_t> state_;  // kRegionMaterial | kRegionDead
  std::vector<std::int64_t> costs_;
  // Regions.
  std::vector<Region> fwd_, rev_;
  RegionWalker walker_;
  absl::flat_hash_set<Slot> affected_, affected_rev_;
  // Union-find.
  EqClasses eq_;
  std::vector<std::int32_t> node_of_;                   // per storage: its current node, -1 = none
  std::vector<Slot> node_storage_;                      // per node: its storage
  // A class's nodes, inline for the usual few (a fresh node per new storage: no allocation for it).
  using Members = absl::InlinedVector<std::int32_t, 4>;
  std::vector<Members> node_members_;  // per root: the nodes of its class (some no longer current)
  std::vector<std::int32_t> node_live_;                 // per root: the current nodes of its class
  std::vector<std::int32_t> roots_;                     // EqSum's scratch
  std::vector<Slot> neighbours_;                        // Evicted's scratch
  // Weights.
  bool all_dirty_ = false;
  std::vector<std::uint8_t> weight_mark_;  // kOut (not in the pool), kClean, kDirty (queued in dirty_)
  std::vector<Slot> dirty_;
};

// Templates.

template <typename IsFree>
void NeighbourhoodCosts::DetachFreed(std::span<const Slot> freed, IsFree is_free) {
  std::vector<Slot> touched;
  for (const Slot s : freed) {
    for (const Slot p : parents_[s]) {
      if (!is_free(p)) touched.push_back(p);
    }
    for (const Slot c : children_[s]) {
      if (!is_free(c)) touched.push_back(c);
    }
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (const Slot n : touched) {
    std::erase_if(parents_[n], is_free);
    std::erase_if(children_[n], is_free);
  }
  for (const Slot s : freed) {
    // A short list keeps its capacity for the slot's reuse; a long one gives its memory back.
    for (std::vector<Slot>* v : {&parents_[s], &children_[s]}) {
      if (v->capacity() > 64) std::vector<Slot>().swap(*v); else v->clear();
    }
  }
}

template <typename IsPinned>
void NeighbourhoodCosts::AbsorbEvicted(Slot s, IsPinned is_pinned) {
  if (!regions_) return;
  for (Slot ps : rev_[s].frontier) {
    if (!is_pinned(ps)) walker_.Absorb(fwd_[ps], fwd_[s], s, costs_);
  }
  for (Slot cs : fwd_[s].frontier) {
    if (!is_pinned(cs)) walker_.Absorb(rev_[cs], rev_[s], s, costs_);
  }
  fwd_[s].Clear();
  rev_[s].Clear();
}

template <typename IsPinned>
void NeighbourhoodCosts::RebuildAround(std::span<const Slot> resident, IsPinned is_pinned) {
  if (!regions_) return;
  affected_.clear();
  affected_rev_.clear();
  for (Slot s : resident) {
    walker_.Rebuild(fwd_[s], s, children_, state_, costs_);
    walker_.Rebuild(rev_[s], s, parents_, state_, costs_);
    for (Slot x : rev_[s].frontier) affected_.insert(x);
    for (Slot x : fwd_[s].frontier) affected_rev_.insert(x);
  }
  for (Slot x : affected_) {
    if (!is_pinned(x)) walker_.Rebuild(fwd_[x], x, children_, state_, costs_);
  }
  for (Slot x : affected_rev_) {
    if (!is_pinned(x)) walker_.Rebuild(rev_[x], x, parents_, state_, costs_);
  }
}

template <typename Excluded>
void NeighbourhoodCosts::Evicted(Slot s, std::int64_t compute, std::size_t pool_size, Excluded excluded) {
  if (!eq_classes_) return;
  LeaveNode(s);  // resident storages have none; kept for the count's sake
  const std::int32_t node = AddNode(s, compute);
  node_of_[s] = node;
  Touch(s);
  // s's evicted neighbours, deduplicated.
  neighbours_.clear();
  auto add = [&](Slot n) {
    if (n == s || excluded(n)) return;
    for (Slot x : neighbours_) {
      if (x == n) return;
    }
    neighbours_.push_back(n);
  };
  for (Slot n : parents_[s]) add(n);
  for (Slot n : children_[s]) add(n);
  for (Slot n : neighbours_) {
    if (node_of_[n] >= 0) MergeNodes(node_of_[n], node);
  }
  TouchClass(node, pool_size);
}

template <typename Excluded>
std::int64_t NeighbourhoodCosts::EqSum(Slot s, Excluded excluded) {
  // A neighbour met twice has the same root, so deduplicating roots is enough: a small local array first, spilling
  // to the scratch vector past 16.
  std::int32_t local[16];
  std::size_t count = 0;
  roots_.clear();
  std::int64_t sum = 0;
  auto visit = [&](Slot n) {
    if (n == s || excluded(n) || node_of_[n] < 0) return;
    const std::int32_t r = eq_.Find(node_of_[n]);
    for (std::size_t k = 0; k < count; ++k) {
      if (local[k] == r) return;
    }
    for (std::int32_t x : roots_) {
      if (x == r) return;
    }
    if (count < 16) local[count++] = r; else roots_.push_back(r);
    sum += eq_.RootValue(r);
  };
  for (Slot n : parents_[s]) visit(n);
  for (Slot n : children_[s]) visit(n);
  return sum;
}

template <typename IsDead>
void NeighbourhoodCosts::MaybeCompactClasses(std::size_t floor, std::size_t storage_count, IsDead is_dead) {
  if (!eq_classes_ || eq_.size() < floor || eq_.size() < 2 * storage_count) return;
  EqClasses eq;
  std::vector<Slot> node_storage;
  std::vector<Members> node_members;
  std::vector<std::int32_t> node_live;
  absl::flat_hash_map<std::int32_t, std::int32_t> new_root;  // old root -> new root
  for (Slot s = 0; s < node_of_.size(); ++s) {
    if (node_of_[s] < 0) continue;
    if (is_dead(s)) {  // never read again through its node (EqSum skips dead neighbours)
      node_of_[s] = -1;
      continue;
    }
    const std::int32_t root = eq_.Find(node_of_[s]);
    auto [it, first] = new_root.try_emplace(root, 0);
    const std::int32_t node = eq.Add(first ? eq_.RootValue(root) : 0);
    node_storage.push_back(s);
    node_members.emplace_back(1, node);
    node_live.push_back(1);
    if (first) {
      it->second = node;
    } else {
      eq.Merge(node, it->second);  // adds 0 to the class's value
      node_members[it->second].push_back(node);
      Members().swap(node_members[node]);
      ++node_live[it->second];
      node_live[node] = 0;
    }
    node_of_[s] = node;
  }
  eq_ = std::move(eq);
  node_storage_.swap(node_storage);
  node_members_.swap(node_members);
  node_live_.swap(node_live);
}

template <typename WeightOf>
void NeighbourhoodCosts::RefreshWeights(EvictionPool& pool, WeightOf weight_of) {
  double* weight = pool.Weights();
  if (all_dirty_) {
    const std::span<const Slot> members = pool.Members();
    for (std::size_t i = 0; i < members.size(); ++i) {
      weight[i] = weight_of(members[i]);
      weight_mark_[members[i]] = kClean;
    }
    dirty_.clear();
    all_dirty_ = false;
    return;
  }
  for (Slot x : dirty_) {
    if (weight_mark_[x] != kDirty) continue;  // left the pool, or queued twice
    weight_mark_[x] = kClean;
    weight[pool.Position(x)] = weight_of(x);
  }
  dirty_.clear();
}

}  // namespace remat
