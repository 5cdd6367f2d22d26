// Engine implementation. Hot paths are flat vectors indexed by dense ids; the eviction pool is an intrusive
// doubly-linked list in insertion order (lock removes, unlock appends), which is what the prototype's tie-breaking
// depends on. The pool is mirrored in dense arrays (struct of arrays, arbitrary slot order: swap-remove) carrying
// each candidate's insertion sequence number, last access and the policy's staleness weight W (see
// Policy::HasStalenessWeight), so a full scan is a tight loop over contiguous doubles; the sequence numbers give
// back the pool order for ties and the early stop.
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "policies/window.h"
#include "runtime/dense_scan.h"
#include "runtime/eq_classes.h"
#include "runtime/regions.h"

namespace remat {
namespace {

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Engine::Impl {
  struct Op {
    std::int64_t cost = 0;
    std::int64_t total_size = 0;
    std::uint32_t in_begin = 0, in_count = 0;
    std::uint32_t out_begin = 0, out_count = 0;
    std::uint32_t name = 0;  // index into names
    bool costly = false;
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
  };
  struct Storage {
    std::int64_t size = 0;
    std::int64_t compute = 0;
    std::int64_t last_access = 0;
    std::uint32_t pool_prev = kNone, pool_next = kNone;  // next to size/compute/last_access: one line per pool step
    std::uint32_t pool_pos = kNone;  // slot in the dense pool arrays while in the pool
    std::int32_t locks = 0;
    std::int32_t ext_refs = 0;
    bool material = false;
    bool computed = false;  // has been computed at least once (evicted vs never produced)
    bool pinned = false;
    bool dead = false;  // free_dead: no reference and nothing alive can ever need it; out of the graph for good
    bool in_pool = false;
    bool has_address = false;
    bool paged = false;     // on the second tier (not material; counts as material for regions and classes)
    bool constant = false;  // no producer (Constant, AdoptConstant, in-place write of a constant)
    bool deferred = false;  // Defer: kept out of the pool (in deferred_list) until the pool runs dry
    bool fixed = false;     // Fix: its address is known outside the engine; never moved, paged out or evicted
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
  std::uint32_t pool_head = kNone, pool_tail = kNone;
  std::size_t pool_size = 0;
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

  // Pool: insertion-ordered intrusive list, mirrored in the dense arrays below (appended at the end, swap-removed;
  // dense_seq increases with insertion, so ordering slots by it gives the list order back).
  std::vector<StorageIndex> dense_storage;
  std::vector<double> dense_weight;  // the policy's StalenessWeight (valid when `weights` and not dirty)
  std::vector<double> dense_last;    // last access, as a double (exact below 2^53)
  std::vector<std::uint64_t> dense_seq;
  std::vector<double> chunk_min;     // the scan's scratch: minimum approximate score per chunk of slots
  std::uint64_t next_seq = 0;
  std::size_t pool_negative = 0;     // pool members with negative bytes (the default path skips them)
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
    Storage& st = storages[s];
    st.last_access = clock;
    if (st.pool_pos != kNone) dense_last[st.pool_pos] = static_cast<double>(clock);
  }
  // reserve = false: into the pool even when deferred (ReleaseDeferred's one choice).
  void PoolAppend(StorageIndex s, bool reserve = true) {
    Storage& st = storages[s];
    if (st.in_pool) return;
    if (reserve && st.deferred) {  // evictable, but only once the pool is empty (ReleaseDeferred); duplicates are harmless
      deferred_list.push_back(s);
      return;
    }
    st.in_pool = true;
    st.pool_prev = pool_tail;
    st.pool_next = kNone;
    if (pool_tail != kNone) storages[pool_tail].pool_next = s; else pool_head = s;
    pool_tail = s;
    ++pool_size;
    st.pool_pos = static_cast<std::uint32_t>(dense_storage.size());
    dense_storage.push_back(s);
    dense_weight.push_back(0);
    dense_last.push_back(static_cast<double>(st.last_access));
    dense_seq.push_back(next_seq++);
    if (st.size < 0) ++pool_negative;
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
    Storage& st = storages[s];
    if (!st.in_pool) return;
    st.in_pool = false;
    if (st.pool_prev != kNone) storages[st.pool_prev].pool_next = st.pool_next; else pool_head = st.pool_next;
    if (st.pool_next != kNone) storages[st.pool_next].pool_prev = st.pool_prev; else pool_tail = st.pool_prev;
    st.pool_prev = st.pool_next = kNone;
    --pool_size;
    const std::uint32_t pos = st.pool_pos;
    const std::uint32_t last = static_cast<std::uint32_t>(dense_storage.size() - 1);
    if (pos != last) {
      const StorageIndex moved = dense_storage[last];
      dense_storage[pos] = moved;
      dense_weight[pos] = dense_weight[last];
      dense_last[pos] = dense_last[last];
      dense_seq[pos] = dense_seq[last];
      storages[moved].pool_pos = pos;
    }
    dense_storage.pop_back();
    dense_weight.pop_back();
    dense_last.pop_back();
    dense_seq.pop_back();
    st.pool_pos = kNone;
    if (st.size < 0) --pool_negative;
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
    if (live > kClassTouchLimit || live * 4 > pool_size) {
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

Engine::Engine(EngineOptions options, Executor* executor)
    : impl_(std::make_unique<Impl>()), options_(options), executor_(executor) {
  impl_->rng.seed(options_.seed);
  if (options_.policy != nullptr) {
    PolicyFeatures f = options_.policy->features();
    impl_->regions = f.regions;
    impl_->eq_classes = f.eq_classes;
    impl_->weights = options_.policy->HasStalenessWeight();
  }
}

Engine::~Engine() = default;

absl::StatusOr<TensorId> Engine::Constant(std::int64_t bytes, std::string_view name) {
  OutputSpec out{bytes, -1};
  absl::StatusOr<std::span<const TensorId>> r = Call({}, {&out, 1}, 0, name);
  if (!r.ok()) return r.status();
  TensorId t = (*r)[0];
  impl_->constant_bytes += bytes;
  impl_->storages[impl_->tensors[t].storage].constant = true;
  Pin(t);
  return t;
}

OpId Engine::NewOp(std::span<const TensorId> inputs, std::int64_t cost, std::string_view name) {
  Impl& m = *impl_;
  Impl::Op op;
  op.cost = cost;
  op.name = m.Name(name);
  op.costly = IsCostlyOp(name);
  op.in_begin = static_cast<std::uint32_t>(m.op_inputs.size());
  op.in_count = static_cast<std::uint32_t>(inputs.size());
  m.op_inputs.insert(m.op_inputs.end(), inputs.begin(), inputs.end());
  op.out_begin = static_cast<std::uint32_t>(m.op_outputs.size());
  m.ops.push_back(op);
  return static_cast<OpId>(m.ops.size() - 1);
}

absl::Status Engine::AddOutputs(OpId op_id, std::span<const OutputSpec> outputs) {
  Impl& m = *impl_;
  Impl::Op& op = m.ops[op_id];
  std::span<const TensorId> inputs = m.Inputs(op);
  for (const OutputSpec& spec : outputs) {
    if (spec.alias >= static_cast<std::int32_t>(inputs.size())) {
      return absl::InvalidArgumentError(absl::StrCat("op '", m.names[op.name], "': alias index ", spec.alias,
                                                     " out of range"));
    }
  }
  op.out_begin = static_cast<std::uint32_t>(m.op_outputs.size());
  op.out_count = static_cast<std::uint32_t>(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const OutputSpec& spec = outputs[i];
    TensorId t = static_cast<TensorId>(m.tensors.size());
    Impl::Tensor tensor;
    tensor.op = op_id;
    tensor.index = static_cast<std::uint32_t>(i);
    tensor.ext_refs = 1;
    StorageIndex s;
    if (spec.alias >= 0) {
      s = m.tensors[inputs[spec.alias]].storage;
      tensor.alias = true;
      tensor.size = 0;
    } else {
      s = static_cast<StorageIndex>(m.storages.size());
      m.storages.emplace_back();
      m.storages.back().size = spec.bytes;
      tensor.size = spec.bytes;
      op.total_size += spec.bytes;
      m.storage_parents.emplace_back();
      m.storage_children.emplace_back();
      m.state.push_back(0);
      m.costs.push_back(0);
      m.weight_mark.push_back(Impl::kOut);
      if (m.regions) {
        m.fwd.emplace_back();
        m.rev.emplace_back();
      }
      if (m.eq_classes) m.storages.back().ecn = m.EqAdd(s, 0);  // placeholder until first computed
    }
    tensor.storage = s;
    Impl::Storage& st = m.storages[s];
    bool op_seen = false;
    for (TensorId u : st.tensors) op_seen = op_seen || m.tensors[u].op == op_id;
    if (!op_seen) {
      st.compute += op.cost;
      m.costs[s] += op.cost;  // a view's base: touched with the op's edges below (views have inputs)
    }
    st.tensors.push_back(t);
    st.ext_refs += 1;
    m.tensors.push_back(std::move(tensor));
    m.op_outputs.push_back(t);
  }
  {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      StorageIndex su = m.tensors[m.op_outputs[op.out_begin + i]].storage;
      for (TensorId p : inputs) {
        StorageIndex sp = m.tensors[p].storage;
        // Repeats change nothing in the walks (marks), so skip the obvious ones (same input twice, many views).
        auto add = [](std::vector<StorageIndex>& v, StorageIndex x) {
          for (std::size_t k = v.size(), n = 0; k > 0 && n < 4; --k, ++n) {
            if (v[k - 1] == x) return;
          }
          v.push_back(x);
        };
        add(m.storage_parents[su], sp);
        add(m.storage_children[sp], su);
        m.Touch(su);
        m.Touch(sp);
      }
    }
  }
  return absl::OkStatus();
}

TensorId Engine::AdoptConstant(std::int64_t bytes, std::uintptr_t address, std::string_view name) {
  Impl& m = *impl_;
  OpId op_id = NewOp({}, 0, name);
  OutputSpec out{bytes, -1, address};
  (void)AddOutputs(op_id, {&out, 1});  // cannot fail: no aliases
  TensorId t = m.Outputs(m.ops[op_id])[0];
  StorageIndex s = m.tensors[t].storage;
  m.tensors[t].defined = true;
  m.SetMaterial(s, true);
  m.storages[s].computed = true;
  m.SetLastAccess(s, stats_.clock);
  if (m.eq_classes) m.LeaveNode(s);
  m.Touch(s);
  if (address != 0) SetAddress(s, address);
  m.storages[s].locks = 1;
  m.storages[s].pinned = true;
  m.storages[s].constant = true;
  m.constant_bytes += bytes;
  stats_.used_bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.used_bytes);
  return t;
}

absl::StatusOr<std::span<const TensorId>> Engine::Call(std::span<const TensorId> inputs,
                                                       std::span<const OutputSpec> outputs, std::int64_t cost,
                                                       std::string_view name) {
  Impl& m = *impl_;
  OpId op_id = NewOp(inputs, cost, name);
  if (absl::Status s = AddOutputs(op_id, outputs); !s.ok()) return s;
  std::span<const TensorId> outs = m.Outputs(m.ops[op_id]);
  if (outs.empty()) {
    // An op without outputs only advances the clock (its inputs still count as accessed).
    for (TensorId p : m.Inputs(m.ops[op_id])) m.SetLastAccess(m.tensors[p].storage, stats_.clock);
    stats_.clock += cost;
    stats_.model_compute += cost;
    return outs;
  }
  m.stack.push_back({outs[0], op_id, false, 0, 0, 0, 0});  // a first execution, driven like a replay
  if (absl::Status run = RunFrames(); !run.ok()) return run;
  for (TensorId t : outs) m.SetLastAccess(m.tensors[t].storage, stats_.clock);
  return outs;
}

absl::StatusOr<OpId> Engine::BeginOp(std::span<const TensorId> inputs, std::string_view name) {
  Impl& m = *impl_;
  OpId op_id = NewOp(inputs, 0, name);
  m.stack.push_back({kNone, op_id, false, 0, 0, 0, 0});  // gather and lock the inputs only
  if (absl::Status run = RunFrames(); !run.ok()) return run;
  running_kernel_ = op_id;  // the caller runs it now
  return op_id;
}

absl::StatusOr<std::span<const TensorId>> Engine::EndOp(OpId op_id, std::span<const OutputSpec> outputs,
                                                        std::int64_t cost) {
  Impl& m = *impl_;
  if (op_id + 1 != m.ops.size() || m.ops[op_id].out_count != 0) {
    return absl::FailedPreconditionError("EndOp must close the most recent BeginOp");
  }
  m.ops[op_id].cost = cost;
  // The kernel has run, but its inputs and outputs keep their addresses until EndOp has registered them.
  absl::Cleanup kernel_done = [this] { running_kernel_ = kNoKernel; };
  pending_ = absl::OkStatus();
  std::vector<OutputSpec> specs(outputs.begin(), outputs.end());  // in-place outputs get their bytes and address
  std::span<const TensorId> ins = m.Inputs(m.ops[op_id]);
  for (OutputSpec& spec : specs) {
    if (spec.in_place_of < 0) continue;
    if (spec.in_place_of >= static_cast<std::int32_t>(ins.size()) || spec.alias >= 0) {
      return absl::InvalidArgumentError("in_place_of must name an input, and an in-place output is no view");
    }
    const Impl::Storage& old = m.storages[m.tensors[ins[spec.in_place_of]].storage];
    spec.bytes = old.size;
    spec.address = old.address;
  }
  if (absl::Status s = AddOutputs(op_id, specs); !s.ok()) return s;
  std::span<const TensorId> outs = m.Outputs(m.ops[op_id]);
  // Recomputable in-place: the written storage's bytes (and address) now hold the new value, a fresh storage made
  // by this op; the old value becomes a memory-less evicted storage that keeps its producer.
  // Writing a constant in place (an optimizer step on a parameter): the new value is a constant too, and the old
  // value is gone for good (nothing can reproduce it), so it leaves the graph.
  std::vector<StorageIndex> new_constants;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].in_place_of < 0) continue;
    StorageIndex old = m.tensors[m.Inputs(m.ops[op_id])[specs[i].in_place_of]].storage;
    if (m.storages[old].pinned) {
      new_constants.push_back(m.tensors[outs[i]].storage);
      Impl::Storage& st = m.storages[old];
      m.SetMaterial(old, false);
      stats_.used_bytes -= st.size;
      st.has_address = false;
      st.dead = true;
      m.Touch(old);
      m.state[old] |= kRegionDead;
      m.constant_bytes -= st.size;
      for (TensorId u : st.tensors) m.tensors[u].defined = false;
    } else if (m.storages[old].material) {
      MarkEvicted(old);
    }
  }
  stats_.clock += cost;
  stats_.model_compute += cost;
  m.remat_storages.clear();
  for (std::size_t i = 0; i < outs.size(); ++i) {
    Impl::Tensor& t = m.tensors[outs[i]];
    t.defined = true;
    if (t.alias) continue;
    Impl::Storage& st = m.storages[t.storage];
    m.SetMaterial(t.storage, true);
    st.computed = true;
    if (specs[i].address != 0) {
      st.address = specs[i].address;
      st.has_address = true;
    }
    stats_.used_bytes += st.size;
    m.remat_storages.push_back(t.storage);
  }
  NotePeak();
  AfterCompute();
  for (StorageIndex c : new_constants) {
    m.Lock(c);
    m.storages[c].pinned = true;
    m.storages[c].constant = true;
    m.constant_bytes += m.storages[c].size;
    if (options_.free_dead) newly_pinned_.push_back(c);
  }
  for (TensorId p : m.Inputs(m.ops[op_id])) m.Unlock(m.tensors[p].storage);
  for (TensorId t : outs) m.SetLastAccess(m.tensors[t].storage, stats_.clock);
  return outs;
}

void Engine::AbortOp(OpId op_id) {
  Impl& m = *impl_;
  running_kernel_ = kNoKernel;
  for (TensorId p : m.Inputs(m.ops[op_id])) m.Unlock(m.tensors[p].storage);
}

void Engine::Retain(TensorId t) {
  impl_->tensors[t].ext_refs += 1;
  impl_->storages[impl_->tensors[t].storage].ext_refs += 1;
}

void Engine::Release(TensorId t) {
  Impl& m = *impl_;
  StorageIndex s = m.tensors[t].storage;
  Impl::Storage& st = m.storages[s];
  if (m.tensors[t].ext_refs <= 0) return;  // already released: a second release is a no-op
  m.tensors[t].ext_refs -= 1;
  st.ext_refs -= 1;
  if (st.ext_refs == 0 && st.material && !st.pinned && st.locks == 0) {
    (void)Evict(s);
    stats_.evictions -= 1;
    stats_.release_evictions += 1;
  } else if (st.ext_refs == 0 && st.paged && !st.pinned && st.locks == 0) {
    // Its host copy goes as a resident one's memory would; it stays recomputable.
    DropPagedCopy(s);
    MarkEvicted(s, /*held_memory=*/false);
    stats_.release_evictions += 1;
  } else if (st.ext_refs == 0 && st.pinned && options_.free_released_constants) {
    DropPinnedBytes(s);
  }
  if (options_.free_dead && st.ext_refs == 0) FreeDead(s);
}

// A storage is dead when it has no external reference and every storage computed from it is dead or pinned (a
// pinned storage is never recomputed): no future op can read it and no replay can need it. That holds for pinned
// storages too. Dead storages leave the graph (they no longer count in neighbourhood costs); a resident one would be
// freed, but eager eviction on release has already dropped its memory.
void Engine::FreeDead(StorageIndex start) {
  Impl& m = *impl_;
  std::vector<StorageIndex> work = {start};
  while (!work.empty()) {
    StorageIndex x = work.back();
    work.pop_back();
    Impl::Storage& st = m.storages[x];
    // A pinned storage holds one lock for its pin; with no reference left (a gradient set to None, a parameter
    // that went away) it dies like any other once nothing can need it, or its record would be kept forever. Only
    // where released pinned storages give their memory back (the PyTorch bridge); the simulator keeps them.
    if (st.pinned && !options_.free_released_constants) continue;
    if (st.dead || st.ext_refs > 0 || st.locks > (st.pinned ? 1 : 0) || !st.computed) continue;
    bool children_dead = true;
    // A pinned child is never recomputed (it stays resident, or comes back from its host copy): it needs nothing.
    for (StorageIndex c : m.storage_children[x]) {
      children_dead = children_dead && (c == x || m.storages[c].dead || m.storages[c].pinned);
    }
    if (!children_dead) continue;
    if (st.pinned) {  // not evictable: its memory leaves the books as a released constant's does
      DropPinnedBytes(x);
    } else if (st.material) {
      (void)Evict(x);
      stats_.evictions -= 1;
      stats_.release_evictions += 1;
    } else if (st.paged) {
      DropPagedCopy(x);
      m.SetMaterial(x, false);
    }
    st.dead = true;
    m.Touch(x);
    m.state[x] |= kRegionDead;
    ++stats_.freed_storages;
    for (StorageIndex p : m.storage_parents[x]) work.push_back(p);
  }
}

void Engine::DropPinnedBytes(StorageIndex s) {
  Impl& m = *impl_;
  Impl::Storage& st = m.storages[s];
  if (st.material) {
    m.SetMaterial(s, false);
    stats_.used_bytes -= st.size;
    for (TensorId u : st.tensors) m.tensors[u].defined = false;
  } else if (st.paged) {
    DropPagedCopy(s);
    m.SetMaterial(s, false);
  }
}

void Engine::NotePeak() {
  if (options_.mode == AccountingMode::kArena && options_.arena != nullptr) {
    stats_.peak_bytes = std::max<std::int64_t>(stats_.peak_bytes, options_.arena->PeakAllocatedBytes());
  } else {
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.used_bytes);
  }
}

void Engine::Defer(TensorId t) {
  Impl& m = *impl_;
  const StorageIndex s = m.tensors[t].storage;
  Impl::Storage& st = m.storages[s];
  if (st.pinned || st.deferred) return;
  st.deferred = true;
  if (st.in_pool) {
    m.PoolRemove(s);
    m.PoolAppend(s);  // into deferred_list
  }
}

bool Engine::ReleaseDeferred() {
  Impl& m = *impl_;
  if (m.deferred_list.empty()) return false;
  released_.clear();
  released_.swap(m.deferred_list);
  std::size_t kept = 0;
  for (StorageIndex s : released_) {
    Impl::Storage& st = m.storages[s];
    if (!st.deferred || st.in_pool || !st.material || st.locks > 0 || st.pinned) continue;
    m.PoolAppend(s, /*reserve=*/false);  // still deferred: RedeferUnchosen takes it out again unless chosen
    released_[kept++] = s;
  }
  released_.resize(kept);
  ++stats_.deferred_releases;
  return m.pool_size > 0;
}

void Engine::RedeferUnchosen() {
  Impl& m = *impl_;
  for (StorageIndex s : released_) {
    Impl::Storage& st = m.storages[s];
    if (!st.deferred) continue;  // pinned since
    if (st.in_pool) {
      m.PoolRemove(s);
      m.PoolAppend(s);  // into deferred_list
    }
  }
  released_.clear();
}

void Engine::Pin(TensorId t) {
  Impl& m = *impl_;
  StorageIndex s = m.tensors[t].storage;
  m.storages[s].deferred = false;
  if (m.storages[s].pinned) return;
  m.Lock(s);
  m.storages[s].pinned = true;
  if (options_.free_dead) newly_pinned_.push_back(s);
}

void Engine::Fix(TensorId t) {
  Pin(t);
  impl_->storages[impl_->tensors[t].storage].fixed = true;
}

void Engine::SetAddress(StorageIndex s, std::uintptr_t address) {
  impl_->storages[s].address = address;
  impl_->storages[s].has_address = address != 0;
}

absl::Status Engine::Evict(StorageIndex s) {
  Impl& m = *impl_;
  Impl::Storage& st = m.storages[s];
  if (!st.material || st.locks != 0 || st.pinned) {
    return absl::FailedPreconditionError(absl::StrCat("storage ", s, " is not evictable"));
  }
  executor_->Evict(*this, s);
  ++stats_.evictions;
  MarkEvicted(s);
  return absl::OkStatus();
}

// s no longer holds memory (evicted, or its bytes now belong to an in-place op's output): it becomes an evicted
// graph node, recomputable by its producer, and the incremental structures learn it.
void Engine::MarkEvicted(StorageIndex s, bool held_memory) {
  Impl& m = *impl_;
  Impl::Storage& st = m.storages[s];
  m.SetMaterial(s, false);
  if (held_memory) stats_.used_bytes -= st.size;
  m.PoolRemove(s);
  for (TensorId t : st.tensors) m.tensors[t].defined = false;
  st.has_address = false;
  if (m.regions) {
    for (StorageIndex ps : m.rev[s].frontier) {
      if (!m.storages[ps].pinned) m.Absorb(m.fwd[ps], s, false);
    }
    for (StorageIndex cs : m.fwd[s].frontier) {
      if (!m.storages[cs].pinned) m.Absorb(m.rev[cs], s, true);
    }
    m.fwd[s].Clear();
    m.rev[s].Clear();
  }
  if (m.eq_classes) {
    m.LeaveNode(s);  // resident storages have none; kept for the count's sake
    st.ecn = m.EqAdd(s, st.compute);
    m.Touch(s);
    m.NonMaterialNeighbours(s, m.neighbours);
    for (StorageIndex n : m.neighbours) {
      if (m.storages[n].ecn >= 0) m.EqMerge(m.storages[n].ecn, st.ecn);
    }
    m.TouchClass(st.ecn);
  }
}

// Rematerialize pushes a replay of `target`; RunFrames runs the frames on the work stack until the one on top when
// it was called is done. Each frame is one op to
// execute: gather inputs (rematerializing undefined ones through child frames), make room, execute, unlock.
absl::Status Engine::Rematerialize(TensorId target) {
  Impl& m = *impl_;
  if (m.tensors[target].defined) return absl::OkStatus();
  if (StorageIndex s = m.tensors[target].storage; m.storages[s].paged) {
    absl::StatusOr<bool> in = PageInStorage(s, /*prefetch=*/false, /*may_reclaim=*/true);
    if (!in.ok()) return in.status();
    if (m.storages[s].ready_at > stats_.clock) {  // the caller wants it on the device now
      stats_.stall_ns += m.storages[s].ready_at - stats_.clock;
      stats_.clock = m.storages[s].ready_at;
    }
    if (m.tensors[target].defined) return absl::OkStatus();
  }
  if (!options_.replay_views) target = m.storages[m.tensors[target].storage].tensors[0];
  m.stack.push_back({target, m.tensors[target].op, true, 0, 0, 0, 0});
  return RunFrames();
}

absl::Status Engine::RunFrames() {
  Impl& m = *impl_;
  const std::size_t base = m.stack.size() - 1;
  const std::size_t scratch_begin = m.scratch.size();
  const std::size_t log_begin = m.lock_log.size();
  pending_ = absl::OkStatus();
  absl::Status status = RunFramesFrom(base);
  if (!status.ok() && !pending_.ok()) {  // an executor's paging error inside MakeRoom is the real cause
    status = pending_;
  }
  pending_ = absl::OkStatus();
  if (!status.ok()) {
    // Leave the engine usable (a caught OOM must not poison it): release the locks the unfinished frames hold.
    for (std::size_t i = m.lock_log.size(); i > log_begin; --i) m.Unlock(m.lock_log[i - 1]);
    m.lock_log.resize(log_begin);
    m.scratch.resize(scratch_begin);
    m.stack.resize(base);
  }
  return status;
}

absl::Status Engine::RunFramesFrom(std::size_t base) {
  Impl& m = *impl_;
  while (m.stack.size() > base) {
    Impl::Frame& f = m.stack.back();
    const Impl::Op& op = m.ops[f.op];
    std::span<const TensorId> inputs = m.Inputs(op);
    if (f.stage == 0) {
      f.lock_begin = static_cast<std::uint32_t>(m.lock_log.size());
      for (TensorId p : inputs) m.SetLastAccess(m.tensors[p].storage, stats_.clock);
      for (TensorId p : inputs) {
        if (m.tensors[p].defined) {
          m.Lock(m.tensors[p].storage);
          m.lock_log.push_back(m.tensors[p].storage);
        }
      }
      f.list_begin = static_cast<std::uint32_t>(m.scratch.size());
      for (TensorId p : inputs) {
        if (!m.tensors[p].defined) m.scratch.push_back(p);
      }
      f.list_end = static_cast<std::uint32_t>(m.scratch.size());
      f.next = f.list_begin;
      f.stage = 1;
    }
    if (f.stage == 2) {  // a child frame just made scratch[next] defined
      m.Lock(m.tensors[m.scratch[f.next]].storage);
      m.lock_log.push_back(m.tensors[m.scratch[f.next]].storage);
      ++f.next;
      f.stage = 1;
    }
    if (f.stage == 1) {
      bool pushed = false;
      while (f.next < f.list_end) {
        TensorId p = m.scratch[f.next];
        if (!m.tensors[p].defined && m.storages[m.tensors[p].storage].paged) {
          // Pushes no frame: f stays valid.
          absl::StatusOr<bool> in = PageInStorage(m.tensors[p].storage, /*prefetch=*/false, /*may_reclaim=*/true);
          if (!in.ok()) return in.status();
        }
        if (!m.tensors[p].defined) {
          f.stage = 2;
          // Without view replay, a view comes back with its storage: replay the storage's producer instead.
          TensorId producer = options_.replay_views ? p : m.storages[m.tensors[p].storage].tensors[0];
          m.stack.push_back({producer, m.tensors[producer].op, true, 0, 0, 0, 0});  // invalidates f
          pushed = true;
          break;
        }
        m.Lock(m.tensors[p].storage);
        m.lock_log.push_back(m.tensors[p].storage);
        ++f.next;
      }
      if (pushed) continue;
    }
    // All inputs resident and locked: wait for their page-ins, make room and execute.
    Impl::Frame frame = m.stack.back();
    WaitForInputs(frame.op);
    if (frame.t == kNone) {  // BeginOp: the caller runs the op; inputs stay locked until EndOp/AbortOp
      m.scratch.resize(frame.list_begin);
      m.lock_log.resize(frame.lock_begin);
      m.stack.pop_back();
      continue;
    }
    const TensorId t = frame.t;
    const OpId op_id = frame.op;
    std::span<const TensorId> outs = m.Outputs(m.ops[op_id]);
    const std::int64_t total = m.ops[op_id].total_size;
    if (options_.mode == AccountingMode::kCounter) {
      if (absl::Status s = MakeRoomCounter(total, m.names[m.ops[op_id].name]); !s.ok()) return s;
    }
    // Execute: the op's outputs are t and its siblings.
    m.dup.clear();
    m.remat_storages.clear();
    for (TensorId u : outs) {
      if (u != t && m.tensors[u].defined) m.dup.push_back(u);
    }
    // A paged pinned sibling keeps its host copy: a storage pinned for good may no longer be reproducible.
    auto paged_pinned = [&](TensorId u) {
      const Impl::Storage& us = m.storages[m.tensors[u].storage];
      return us.paged && us.pinned;
    };
    for (TensorId u : outs) {
      if (u != t && !m.storages[m.tensors[u].storage].material && !paged_pinned(u)) {
        m.remat_storages.push_back(m.tensors[u].storage);
      }
    }
    if (!m.storages[m.tensors[t].storage].material) m.remat_storages.push_back(m.tensors[t].storage);
    stats_.clock += m.ops[op_id].cost;
    if (frame.remat) {
      stats_.remat_compute += m.ops[op_id].cost;
      ++stats_.rematerializations;
    } else {
      stats_.model_compute += m.ops[op_id].cost;
    }
    if (options_.mode == AccountingMode::kCounter) {
      stats_.used_bytes += total;
      stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.used_bytes);
    }
    m.fresh.assign(m.remat_storages.begin(), m.remat_storages.end());
    // Arena mode: placing the fresh outputs may make room, and the op's outputs that are still resident (replay of
    // a multi-output op) must not be the victims. Counter mode made room above (and keeps the prototype's pool
    // order, which locking would change).
    const bool lock_siblings = options_.mode == AccountingMode::kArena;
    if (lock_siblings) {
      for (TensorId u : m.dup) m.Lock(m.tensors[u].storage);
    }
    const OpId outer_kernel = running_kernel_;  // kNoKernel: replays run inside BeginOp, before the op's kernel
    running_kernel_ = op_id;
    absl::Status executed = executor_->Execute(*this, op_id, frame.remat, m.fresh);
    running_kernel_ = outer_kernel;
    if (lock_siblings) {
      for (TensorId u : m.dup) m.Unlock(m.tensors[u].storage);
    }
    if (!executed.ok()) {
      if (!absl::IsResourceExhausted(executed)) return executed;
      return WithMemoryReport(executed.message(), "");
    }
    if (options_.mode == AccountingMode::kArena) {
      for (StorageIndex s : m.remat_storages) stats_.used_bytes += m.storages[s].size;
      NotePeak();
    }
    for (StorageIndex s : m.remat_storages) {
      if (m.storages[s].paged) DropPagedCopy(s);  // recomputed: the host copy is stale weight
    }
    m.SetMaterial(m.tensors[t].storage, true);
    m.storages[m.tensors[t].storage].computed = true;
    m.tensors[t].defined = true;
    for (TensorId u : outs) {
      if (u == t || m.tensors[u].defined || paged_pinned(u)) continue;
      m.SetMaterial(m.tensors[u].storage, true);
      m.storages[m.tensors[u].storage].computed = true;
      m.tensors[u].defined = true;
    }
    if (!options_.replay_views) {
      for (StorageIndex s : m.remat_storages) {
        for (TensorId u : m.storages[s].tensors) m.tensors[u].defined = true;
      }
    }
    if (options_.mode == AccountingMode::kCounter) {
      for (TensorId u : m.dup) stats_.used_bytes -= m.tensors[u].size;
    }
    AfterCompute();
    for (TensorId p : m.Inputs(m.ops[op_id])) m.Unlock(m.tensors[p].storage);
    m.lock_log.resize(frame.lock_begin);
    m.scratch.resize(frame.list_begin);
    m.stack.pop_back();
    if (options_.remat_limit >= 0 && stats_.remat_compute + stats_.stall_ns > options_.remat_limit) {
      return absl::AbortedError(absl::StrFormat("thrashing: replayed %d ns + transfer stall %d ns > limit %d ns",
                                                stats_.remat_compute, stats_.stall_ns, options_.remat_limit));
    }
  }
  return absl::OkStatus();
}

// The storages in impl_->remat_storages just became resident: they join the pool and the incremental structures
// learn it (regions rebuilt around them, their union-find classes lose their cost).
void Engine::AfterCompute() {
  Impl& m = *impl_;
  for (StorageIndex s : m.remat_storages) m.PoolAppend(s);
  if (m.regions) {
    m.affected.clear();
    m.affected_rev.clear();
    for (StorageIndex s : m.remat_storages) {
      m.Rebuild(s, false);
      m.Rebuild(s, true);
      for (StorageIndex x : m.rev[s].frontier) m.affected.insert(x);
      for (StorageIndex x : m.fwd[s].frontier) m.affected_rev.insert(x);
    }
    for (StorageIndex x : m.affected) {
      if (!m.storages[x].pinned) m.Rebuild(x, false);
    }
    for (StorageIndex x : m.affected_rev) {
      if (!m.storages[x].pinned) m.Rebuild(x, true);
    }
  }
  if (m.eq_classes) {
    for (StorageIndex s : m.remat_storages) {
      Impl::Storage& st = m.storages[s];
      if (st.ecn >= 0) {
        m.eq.Value(st.ecn) -= st.compute;
        m.TouchClass(st.ecn);
      }
      m.LeaveNode(s);
      m.Touch(s);
    }
  }
}

// The executor's out-of-memory message, `context`, and the memory report, unless the message has it already (in
// arena mode the engine is the arena's pressure handler, and the arena adds DescribeMemory when it gives up).
absl::Status Engine::WithMemoryReport(absl::string_view message, absl::string_view context) const {
  if (absl::StrContains(message, kMemoryReportMarker)) {
    return absl::ResourceExhaustedError(absl::StrCat(message, context));
  }
  return absl::ResourceExhaustedError(absl::StrCat(message, context, "; ", MemoryReport()));
}

// Budget, bytes in use, locked and constant bytes, and in arena mode the largest run of free or evictable blocks
// (the largest window any eviction could have made).
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
  absl::StrAppend(&report, ", pinned results ", pinned, ")");
  // Where it happened: the op the caller runs and, when it ran out while replaying, the innermost replay; or the
  // kernel running between BeginOp and EndOp.
  if (m.stack.empty() && running_kernel_ != kNoKernel && running_kernel_ < m.ops.size()) {
    absl::StrAppend(&report, ", running '", m.names[m.ops[running_kernel_].name], "'");
  }
  if (!m.stack.empty()) {
    absl::StrAppend(&report, ", running '", m.names[m.ops[m.stack.front().op].name], "'");
    const auto replays = std::count_if(m.stack.begin(), m.stack.end(), [](const Impl::Frame& f) { return f.remat; });
    if (replays > 0 && m.stack.back().remat) {
      absl::StrAppend(&report, " and replaying '", m.names[m.ops[m.stack.back().op].name], "' for it (", replays,
                      " replay(s) deep)");
    }
  }
  if (options_.arena != nullptr) {
    std::size_t run = 0, largest = 0;
    options_.arena->ForEachBlock([&](const BlockInfo& b) {
      bool usable = b.free || (b.owner != kNoOwner && b.owner - 1 < m.storages.size() && m.storages[b.owner - 1].in_pool);
      run = usable ? run + b.size : 0;
      largest = std::max(largest, run);
    });
    absl::StrAppend(&report, ", largest window of free or evictable blocks ", largest, " bytes");
  }
  return report;
}

bool Engine::MakeRoom(Arena& arena, std::size_t bytes) {
  const bool made = MakeRoomOnce(arena, bytes);
  failed_request_ = made ? 0 : bytes;
  return made;
}

bool Engine::MakeHoleForRetry() {
  Arena* arena = options_.arena;
  if (arena == nullptr || failed_request_ == 0 || !pending_.ok()) return false;
  const std::size_t bytes = failed_request_;
  failed_request_ = 0;
  const OpId kernel = running_kernel_;
  running_kernel_ = kNoKernel;
  // The kernel may allocate more than the request it failed on: gather every free byte into one hole if nothing
  // stands in the way, else as many as the request needs.
  const std::size_t alignment = arena->alignment();
  const std::size_t all_free = arena->Stats().free_bytes / alignment * alignment;
  if (!(all_free > bytes && Compact(*arena, all_free))) Compact(*arena, bytes);
  running_kernel_ = kernel;
  return arena->Stats().largest_free_block >= bytes;
}

bool Engine::MakeRoomOnce(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  if (no_reclaim_ || !pending_.ok()) return false;
  if (!pressure_sampled_) {
    pressure_sampled_ = true;
    ArenaStats s = arena.Stats();
    if (options_.budget > 0) {
      stats_.fragmentation_sum += static_cast<double>(s.free_bytes) / static_cast<double>(options_.budget);
      ++stats_.fragmentation_samples;
    }
  }
  std::int64_t start = NowNs();
  absl::Cleanup redefer = [this] { RedeferUnchosen(); };  // after the choice's victims are evicted
  // When the policy has nothing left: page a constant, or move memory; deferred storages (gradients) go last.
  auto last_resort = [&] { return PageLruConstant() || RelocateIdle(arena, bytes) || Compact(arena, bytes); };
  if (options_.policy->UsesWindows()) {
    std::optional<Window> window = ChooseWindow(arena, bytes);
    stats_.search_ns += NowNs() - start;
    if (!window || window->owners.empty()) {
      if (last_resort()) return true;
      if (!ReleaseDeferred()) return false;
      window = ChooseWindow(arena, bytes);
      if (!window || window->owners.empty()) return false;
    }
    for (OwnerId o : window->owners) {
      if (absl::Status s = Reclaim(static_cast<StorageIndex>(o - 1)); !s.ok()) {
        pending_ = s;
        return false;
      }
    }
    return true;
  }
  if (m.pool_size == 0) {
    stats_.search_ns += NowNs() - start;
    if (last_resort()) return true;
    if (!ReleaseDeferred()) return false;
    start = NowNs();
  }
  std::optional<StorageIndex> pick = ChooseFromPool();
  stats_.search_ns += NowNs() - start;
  if (!pick) return false;
  if (absl::Status s = Reclaim(*pick); !s.ok()) {
    pending_ = s;
    return false;
  }
  return true;
}

bool Engine::UsedByRunningKernel(StorageIndex s) const {
  const Impl& m = *impl_;
  if (running_kernel_ == kNoKernel) return false;
  const Impl::Op& op = m.ops[running_kernel_];
  for (TensorId t : m.Inputs(op)) {
    if (m.tensors[t].storage == s) return true;
  }
  for (TensorId t : m.Outputs(op)) {
    if (m.tensors[t].storage == s) return true;
  }
  return false;
}

bool Engine::RelocateIdle(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  if (!options_.relocate || !pending_.ok()) return false;
  // Resident storages the policy cannot evict (constants, pinned results, inputs locked by an op still gathering
  // the others) that no running kernel touches, by address.
  absl::flat_hash_map<std::uintptr_t, StorageIndex> movable;
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    const Impl::Storage& st = m.storages[s];
    if (!st.material || !st.has_address || st.paged || st.in_pool || st.fixed) continue;
    if (!st.pinned && st.locks == 0) continue;
    if (UsedByRunningKernel(s)) continue;
    movable.emplace(st.address, s);
  }
  if (movable.empty()) return false;
  // The run that needs the fewest bytes moved: free blocks cost nothing, movable storages their size, anything
  // else (in use, or evictable but not evicted: the policy had its chance) is a barrier.
  std::optional<Window> window = arena.FindWindow(bytes, [&](const BlockInfo& block) -> std::optional<double> {
    if (movable.contains(block.address)) return static_cast<double>(block.size);
    return std::nullopt;
  });
  if (!window) return false;
  const Executor::AddressRange avoid{window->address, window->address + window->size};
  std::vector<std::pair<std::uintptr_t, StorageIndex>> inside;
  for (const auto& [address, s] : movable) {
    if (avoid.Overlaps(address, static_cast<std::size_t>(m.storages[s].size))) inside.emplace_back(address, s);
  }
  std::sort(inside.begin(), inside.end());
  bool moved = false;
  for (const auto& [address, s] : inside) {
    absl::StatusOr<bool> relocated = executor_->Relocate(*this, s, avoid);
    if (!relocated.ok()) {
      pending_ = relocated.status();
      return false;
    }
    if (!*relocated) break;  // no hole outside the window holds it
    moved = true;
    ++stats_.relocations;
    stats_.relocated_bytes += m.storages[s].size;
    // A storage locked only for now joins the pool later: its new block must name it for the window policies.
    if (!m.storages[s].pinned) (void)arena.SetOwner(m.storages[s].address, OwnerId{s} + 1);
  }
  return moved;
}

bool Engine::Compact(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  if (!options_.relocate || !pending_.ok()) return false;
  // Blocks in address order; `storage` is kNoStorage for a barrier (unknown to the engine, or in use now).
  constexpr StorageIndex kNoStorage = ~StorageIndex{0};
  struct Block {
    std::uintptr_t address;
    std::size_t size;
    bool free;
    StorageIndex storage;
  };
  absl::flat_hash_map<std::uintptr_t, StorageIndex> movable;
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    const Impl::Storage& st = m.storages[s];
    if (st.material && st.has_address && !st.paged && !st.fixed && !UsedByRunningKernel(s)) {
      movable.emplace(st.address, s);
    }
  }
  std::vector<Block> blocks;
  arena.ForEachBlock([&](const BlockInfo& b) {
    auto it = b.free ? movable.end() : movable.find(b.address);
    blocks.push_back(Block{b.address, b.size, b.free, it == movable.end() ? kNoStorage : it->second});
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
  if (best_cost == std::numeric_limits<std::size_t>::max() || best_cost == 0) return false;
  std::uintptr_t to = blocks[best_l].address;
  bool moved = false;
  for (std::size_t i = best_l; i <= best_r; ++i) {
    const Block& b = blocks[i];
    if (b.free) continue;
    absl::StatusOr<bool> slid = executor_->Slide(*this, b.storage, to);
    if (!slid.ok()) {
      pending_ = slid.status();
      return false;
    }
    if (!*slid) break;  // the executor cannot move it: what moved so far still joined some holes
    moved = true;
    stats_.compacted_bytes += static_cast<std::int64_t>(b.size);
    to += b.size;
  }
  stats_.compactions += moved;
  return moved;
}

// ---- Paging ----

std::int64_t Engine::TransferNs(std::int64_t bytes) const {
  const double bw = options_.paging.bandwidth_bytes_per_s;
  const double ns = bw > 0 ? static_cast<double>(bytes) * 1e9 / bw : std::numeric_limits<double>::infinity();
  if (ns >= 1e18) return std::numeric_limits<std::int64_t>::max() / 4;
  return options_.paging.latency_ns + static_cast<std::int64_t>(std::ceil(ns));
}

std::int64_t Engine::IssueCopy(std::int64_t bytes, bool in, std::int64_t not_before) {
  std::int64_t& free = in && options_.paging.duplex ? link_in_free_ : link_free_;
  const std::int64_t start = std::max({stats_.clock, free, not_before});
  free = start + TransferNs(bytes);
  return free;
}

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
  std::int64_t neighbourhood = m.regions ? RegionCompute(s) : m.eq_classes ? EqClassCompute(s)
                                                                          : EvictedNeighbourCompute(s);
  const std::int64_t recompute = st.compute + neighbourhood;
  const std::int64_t backlog = std::max<std::int64_t>(0, std::max(link_free_, link_in_free_) - stats_.clock);
  const std::int64_t unhidden = backlog + 2 * TransferNs(st.size);
  return unhidden < recompute;
}

absl::Status Engine::Reclaim(StorageIndex s) {
  if (PrefersPaging(s)) return PageOutStorage(s);
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
  st.ready_at = IssueCopy(st.size, /*in=*/false, 0);  // when the host copy is complete
  st.material = false;  // the region state keeps its material bit: a paged storage bounds evicted regions
  st.paged = true;
  m.Touch(s);
  m.PoolRemove(s);
  for (TensorId t : st.tensors) {
    m.tensors[t].paged_defined = m.tensors[t].defined;
    m.tensors[t].defined = false;
  }
  st.has_address = false;
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
  absl::Status x = executor_->PageIn(*this, s);
  no_reclaim_ = false;
  if (!x.ok()) {
    if (!pending_.ok()) return pending_;
    if (!absl::IsResourceExhausted(x)) return x;
    if (prefetch) return false;
    return WithMemoryReport(x.message(), absl::StrCat(" (paging in storage ", s, ")"));
  }
  st.ready_at = IssueCopy(st.size, /*in=*/true, st.ready_at);  // after its own page-out
  st.paged = false;
  st.material = true;
  m.Touch(s);
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
  impl_->Touch(s);
  stats_.host_used_bytes -= st.size;
}

absl::StatusOr<bool> Engine::Prefetch(TensorId t) {
  Impl& m = *impl_;
  if (t >= m.tensors.size()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", t));
  return PageInStorage(m.tensors[t].storage, /*prefetch=*/true, /*may_reclaim=*/false);
}

absl::StatusOr<int> Engine::PrefetchAhead(std::span<const TensorId> upcoming, bool make_room) {
  Impl& m = *impl_;
  pending_ = absl::OkStatus();
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
  pending_ = absl::OkStatus();
  if (!error.ok()) return error;
  return issued;
}

void Engine::WaitForInputs(OpId op) {
  Impl& m = *impl_;
  std::int64_t ready = stats_.clock;
  for (TensorId p : m.Inputs(m.ops[op])) ready = std::max(ready, m.storages[m.tensors[p].storage].ready_at);
  if (ready > stats_.clock) {
    stats_.stall_ns += ready - stats_.clock;
    stats_.clock = ready;
  }
}

absl::Status Engine::MakeRoomCounter(std::int64_t bytes, std::string_view what) {
  Impl& m = *impl_;
  while (stats_.used_bytes + bytes > options_.budget) {
    if (m.pool_size == 0 && PageLruConstant()) continue;
    absl::Cleanup redefer = [this] { RedeferUnchosen(); };  // after this round's victim is evicted
    if (m.pool_size == 0 && !ReleaseDeferred()) {
      std::int64_t locked = 0;
      for (const Impl::Storage& st : m.storages) {
        if (st.material && st.locks > 0 && !st.pinned) locked += st.size;
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of memory running '%s': requested %d bytes, budget %d, in use %d (locked by the running ops %d, "
          "constant %d), nothing left to evict",
          what, bytes, options_.budget, stats_.used_bytes, locked, m.constant_bytes));
    }
    std::int64_t start = NowNs();
    std::optional<StorageIndex> pick = ChooseFromPool();
    stats_.search_ns += NowNs() - start;
    if (!pick) return absl::InternalError("policy chose nothing from a non-empty pool");
    if (absl::Status s = Reclaim(*pick); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool Engine::PageLruConstant() {
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
  if (absl::Status s = PageOutStorage(best); !s.ok()) {
    pending_ = s;
    return false;
  }
  return true;
}

bool Engine::Defined(TensorId t) const { return impl_->tensors[t].defined; }
StorageIndex Engine::StorageOf(TensorId t) const { return impl_->tensors[t].storage; }
TensorId Engine::StorageRoot(StorageIndex s) const { return impl_->storages[s].tensors[0]; }
bool Engine::Resident(StorageIndex s) const { return impl_->storages[s].material; }
bool Engine::Dead(StorageIndex s) const { return impl_->storages[s].dead; }

void Engine::CollectDead() {
  Impl& m = *impl_;
  // Only a parent of a storage pinned since the last call can have become dead this way; FreeDead checks the
  // rest and walks further up.
  for (const StorageIndex s : newly_pinned_) {
    for (const StorageIndex p : m.storage_parents[s]) FreeDead(p);
  }
  newly_pinned_.clear();
}
std::int64_t Engine::StorageBytes(StorageIndex s) const { return impl_->storages[s].size; }
std::uintptr_t Engine::StorageAddress(StorageIndex s) const { return impl_->storages[s].address; }
std::int64_t Engine::ExternalRefs(TensorId t) const { return impl_->tensors[t].ext_refs; }
std::int64_t Engine::StorageExternalRefs(StorageIndex s) const { return impl_->storages[s].ext_refs; }
OpId Engine::ProducerOf(TensorId t) const { return impl_->tensors[t].op; }
std::span<const TensorId> Engine::OpInputs(OpId op) const { return impl_->Inputs(impl_->ops[op]); }
std::span<const TensorId> Engine::OpOutputs(OpId op) const { return impl_->Outputs(impl_->ops[op]); }
std::string_view Engine::OpName(OpId op) const { return impl_->names[impl_->ops[op].name]; }
bool Engine::OpCostly(OpId op) const { return impl_->ops[op].costly; }
std::int64_t Engine::OpCost(OpId op) const { return impl_->ops[op].cost; }
std::size_t Engine::storage_count() const { return impl_->storages.size(); }
std::size_t Engine::tensor_count() const { return impl_->tensors.size(); }

std::vector<StorageIndex> Engine::PoolOrder() const {
  std::vector<StorageIndex> out;
  for (std::uint32_t s = impl_->pool_head; s != kNone; s = impl_->storages[s].pool_next) out.push_back(s);
  return out;
}

std::optional<StorageIndex> Engine::ChooseFromPool() {
  Impl& m = *impl_;
  if (m.weights && !options_.choose.sample_sqrt && !options_.choose.ignore_small) {
    if (std::optional<StorageIndex> pick = DenseChoice()) return pick;
  }
  ChooseContext ctx{&m.rng, &stats_.heuristic_evaluations};
  m.candidates.clear();
  for (std::uint32_t s = m.pool_head; s != kNone; s = m.storages[s].pool_next) m.candidates.push_back(s);
  std::optional<std::size_t> pick = options_.policy->Choose(*this, m.candidates, options_.choose, ctx);
  if (!pick) return std::nullopt;
  return static_cast<StorageIndex>(m.candidates[*pick]);
}

void Engine::RefreshWeights() {
  Impl& m = *impl_;
  if (m.all_dirty) {
    for (std::size_t i = 0; i < m.dense_storage.size(); ++i) {
      m.dense_weight[i] = options_.policy->StalenessWeight(*this, m.dense_storage[i]);
      m.weight_mark[m.dense_storage[i]] = Impl::kClean;
    }
    m.dirty.clear();
    m.all_dirty = false;
    return;
  }
  for (StorageIndex x : m.dirty) {
    if (m.weight_mark[x] != Impl::kDirty) continue;  // left the pool, or queued twice
    m.weight_mark[x] = Impl::kClean;
    m.dense_weight[m.storages[x].pool_pos] = options_.policy->StalenessWeight(*this, x);
  }
  m.dirty.clear();
}

// Clocks and last accesses below 2^53 are exact doubles, so clock - last access is the exact staleness.
constexpr std::int64_t kExactDoubleLimit = std::int64_t{1} << 53;

// Policy::Choose's full scan (ties to the later candidate in pool order, stop at the first score of exactly 0)
// over the dense arrays. Pass 1 computes the approximate score W / staleness of every slot (a branch-free loop the
// compiler vectorizes) and its minimum qmin. By the policy's contract each approximate score is within 1e-12
// relative of the exact one with the same sign, zero-ness and infinity, so:
//   - qmin > 0 finite: no zero stops the scan and every candidate is evaluated; the exact minimum and all its ties
//     have approximate scores <= qmin * (1 + 1e-9), and only those are re-scored exactly (Policy::Score), ties
//     going to the highest sequence number (the later candidate);
//   - qmin == 0: no score is negative; the scan stops at the zero-scored candidate with the lowest sequence
//     number, which is the choice (nothing before it scores 0 or less), after evaluating every candidate up to it;
//   - qmin == infinity: every score is infinite; the last candidate (the pool's tail) wins the ties.
// Negative scores, negative byte counts and clocks past 2^53 are left to the default path (nullopt).
std::optional<StorageIndex> Engine::DenseChoice() {
  Impl& m = *impl_;
  const std::size_t n = m.dense_storage.size();
  if (n == 0 || m.pool_negative > 0 || stats_.clock >= kExactDoubleLimit) return std::nullopt;
  RefreshWeights();
  const double clock = static_cast<double>(stats_.clock);
  const double inf = std::numeric_limits<double>::infinity();
  const double* w = m.dense_weight.data();
  const double* last = m.dense_last.data();
  const std::uint64_t* seq = m.dense_seq.data();
  const std::size_t chunks = (n + kScanChunk - 1) / kScanChunk;
  m.chunk_min.resize(chunks);
  const double qmin = ChunkMinima(w, last, n, clock, m.chunk_min.data());
  if (!(qmin >= 0)) return std::nullopt;  // a negative score (or NaN): the ordered default path
  std::size_t pick = 0;
  std::int64_t evaluated = static_cast<std::int64_t>(n);
  if (qmin == inf) {
    stats_.heuristic_evaluations += evaluated;
    return m.pool_tail;
  }
  // Pass 2 revisits only the chunks whose minimum is within reach.
  if (qmin == 0) {
    std::uint64_t first = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t c = 0; c < chunks; ++c) {
      if (m.chunk_min[c] > 0) continue;
      for (std::size_t i = c * kScanChunk, end = std::min(n, i + kScanChunk); i < end; ++i) {
        if (ApproxScore(w[i], last[i], clock) == 0 && seq[i] < first) {
          first = seq[i];
          pick = i;
        }
      }
    }
    evaluated = 0;
    for (std::size_t i = 0; i < n; ++i) evaluated += seq[i] <= first;
  } else {
    const double threshold = qmin * (1 + 1e-9);
    double best = inf;
    bool found = false;
    for (std::size_t c = 0; c < chunks; ++c) {
      if (m.chunk_min[c] > threshold) continue;
      for (std::size_t i = c * kScanChunk, end = std::min(n, i + kScanChunk); i < end; ++i) {
        if (ApproxScore(w[i], last[i], clock) > threshold) continue;
        const double exact = options_.policy->Score(*this, m.dense_storage[i]);
        if (!found || exact < best || (exact == best && seq[i] > seq[pick])) {
          best = exact;
          pick = i;
          found = true;
        }
      }
    }
  }
  stats_.heuristic_evaluations += evaluated;
  return m.dense_storage[pick];
}

std::optional<Window> Engine::ChooseWindow(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  std::int64_t evaluations = 0;
  std::optional<Window> window;
  if (m.weights && stats_.clock < kExactDoubleLimit) {
    // Every evictable storage's window cost (W / staleness, bit for bit the policy's WindowCost by its contract)
    // into a per-storage array before the search, so the per-block callback is one copy; the pool's entries are
    // reset to nullopt (barrier) afterwards.
    RefreshWeights();
    if (m.window_cost.size() < m.storages.size()) m.window_cost.resize(m.storages.size());
    const double clock = static_cast<double>(stats_.clock);
    std::optional<double>* costs = m.window_cost.data();
    for (std::size_t i = 0; i < m.dense_storage.size(); ++i) {
      const double t = clock - m.dense_last[i];
      const double cost = m.dense_weight[i] / t;
      if (t > 0 && std::isfinite(cost)) costs[m.dense_storage[i]] = cost;
    }
    static const std::optional<double> kBarrier;
    const std::size_t count = m.window_cost.size();
    window = arena.FindWindow(bytes, [&](const BlockInfo& block) -> std::optional<double> {
      evaluations += block.owner != kNoOwner;
      const OwnerId s = block.owner - 1;  // kNoOwner wraps around past `count`
      return s < count ? costs[s] : kBarrier;
    });
    for (StorageIndex s : m.dense_storage) costs[s].reset();
  } else {
    window = arena.FindWindow(bytes, [&](const BlockInfo& block) -> std::optional<double> {
      if (block.owner == kNoOwner) return std::nullopt;
      ++evaluations;
      return options_.policy->WindowCost(*this, block.owner - 1);
    });
  }
  stats_.heuristic_evaluations += evaluations;
  return window;
}

std::optional<Window> Engine::PickWindow(std::size_t bytes) {
  if (options_.arena == nullptr || !options_.policy->UsesWindows()) return std::nullopt;
  return ChooseWindow(*options_.arena, bytes);
}

std::optional<StorageIndex> Engine::PickVictim() {
  if (impl_->pool_size == 0) return std::nullopt;
  return ChooseFromPool();
}

// StorageView.
std::int64_t Engine::Clock() const { return stats_.clock; }
std::int64_t Engine::Bytes(StorageId s) const { return impl_->storages[s].size; }
std::int64_t Engine::Compute(StorageId s) const { return impl_->storages[s].compute; }
std::int64_t Engine::LastAccess(StorageId s) const { return impl_->storages[s].last_access; }
bool Engine::Evictable(StorageId s) const { return s < impl_->storages.size() && impl_->storages[s].in_pool; }
std::int64_t Engine::RegionCompute(StorageId s) const {
  if (!impl_->regions) return 0;
  return impl_->fwd[s].compute + impl_->rev[s].compute;
}
std::int64_t Engine::AncestorCompute(StorageId s) const { return impl_->regions ? impl_->rev[s].compute : 0; }
std::int64_t Engine::EqClassCompute(StorageId s) const {
  Impl& m = *impl_;
  if (!m.eq_classes) return 0;
  return m.EqSum(static_cast<StorageIndex>(s));
}
std::int64_t Engine::EvictedNeighbourCompute(StorageId s) const {
  // NonMaterialNeighbours + sum, in one pass: distinct neighbours kept in a small local array first (no vector
  // rebuilt per call), spilling to the scratch vector past 16.
  Impl& m = *impl_;
  const StorageIndex self = static_cast<StorageIndex>(s);
  StorageIndex local[16];
  std::size_t count = 0;
  m.neighbours.clear();
  std::int64_t sum = 0;
  auto visit = [&](StorageIndex n) {
    const Impl::Storage& ns = m.storages[n];
    if (n == self || ns.material || ns.paged || ns.dead) return;
    for (std::size_t k = 0; k < count; ++k) {
      if (local[k] == n) return;
    }
    for (StorageIndex x : m.neighbours) {
      if (x == n) return;
    }
    if (count < 16) local[count++] = n; else m.neighbours.push_back(n);
    if (ns.computed) sum += ns.compute;
  };
  for (StorageIndex n : m.storage_parents[self]) visit(n);
  for (StorageIndex n : m.storage_children[self]) visit(n);
  return sum;
}
std::int64_t Engine::AdjacentFreeBytes(StorageId s) const {
  const Impl::Storage& st = impl_->storages[s];
  if (options_.arena == nullptr || !st.has_address) return 0;
  return static_cast<std::int64_t>(options_.arena->AdjacentFreeBytes(st.address));
}
bool Engine::Costly(StorageId s) const {
  const Impl::Storage& st = impl_->storages[s];
  return !st.tensors.empty() && impl_->ops[impl_->tensors[st.tensors[0]].op].costly;
}

}  // namespace remat
