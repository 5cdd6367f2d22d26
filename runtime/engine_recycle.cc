// Engine recycling: the slots of ops, tensors and storages nothing can need any more go back for reuse, and the
// tables that otherwise grow with every op or eviction (op input/output lists, union-find nodes, the deferred
// reserve) are compacted, so that the engine's state follows what is live, not how long the run has been
// (engine.h, "Recycling").
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "runtime/engine.h"
#include "runtime/engine_impl.h"

namespace remat {
namespace {

// Compaction thresholds: garbage must outnumber what is used (amortized O(1) per freed entry) and pass a floor
// (no compaction churn on small runs).
constexpr std::size_t kCompactFloor = 4096;

}  // namespace

bool Engine::OpInert(OpId op_id) const {
  const Impl& m = *impl_;
  const Impl::Op& op = m.ops[op_id];
  if (op.free || op.inert) return true;
  if (op_id == m.open_op) return false;  // its kernel runs: outputs to come
  for (const TensorId u : m.Outputs(op)) {
    const Impl::Storage& st = m.storages[m.tensors[u].storage];
    if (!st.dead && !st.pinned) return false;
  }
  return true;
}

RecycledIds Engine::Recycle(absl::FunctionRef<bool(OpId)> held) {
  Impl& m = *impl_;
  RecycledIds out;
  if (!m.stack.empty()) return out;  // inside a call: frames hold ids
  for (const StorageIndex s : m.settled) {
    if (m.storages[s].free) continue;
    for (const TensorId u : m.storages[s].tensors) m.recycle_ops.push_back(m.tensors[u].op);
  }
  m.settled.clear();
  std::vector<OpId> still_held;
  while (!m.recycle_ops.empty()) {
    const OpId o = m.recycle_ops.back();
    m.recycle_ops.pop_back();
    if (m.ops[o].free || !OpInert(o)) continue;
    Impl::Op& op = m.ops[o];
    if (!op.inert) {
      // Nothing will replay it: its inputs are no longer needed by it.
      op.inert = true;
      for (const TensorId p : m.Inputs(op)) {
        if (--m.tensors[p].consumers == 0) m.recycle_ops.push_back(m.tensors[p].op);
      }
      m.io_garbage += op.in_count;
      op.in_count = 0;
    }
    bool freeable = true;
    for (const TensorId u : m.Outputs(op)) {
      const Impl::Tensor& tu = m.tensors[u];
      const Impl::Storage& st = m.storages[tu.storage];
      // A dead storage holds no memory (a replay never brings one back), so its slot can go; the guard keeps one
      // that would (memory, a host copy, a place in the pool) rather than lose track of it.
      freeable = freeable && tu.consumers == 0 && tu.ext_refs == 0 && st.dead && !st.material && !st.paged &&
                 !m.InPool(tu.storage);
    }
    if (!freeable) continue;
    if (held(o)) {
      still_held.push_back(o);  // tried again at the next call
    } else {
      FreeOp(o, out);
    }
  }
  m.recycle_ops.swap(still_held);
  DetachFreedStorages(out.storages);
  CompactOpLists();
  CompactEqClasses();
  // Deferred storages join the reserve each time they would join the pool; duplicates and storages that left it
  // pile up between two pressure events that reach it.
  const std::size_t live_storages = m.storages.size() - m.free_storages.size();
  if (m.deferred_list.size() > kCompactFloor && m.deferred_list.size() > 2 * live_storages) {
    std::sort(m.deferred_list.begin(), m.deferred_list.end());
    m.deferred_list.erase(std::unique(m.deferred_list.begin(), m.deferred_list.end()), m.deferred_list.end());
    std::erase_if(m.deferred_list, [&](StorageIndex s) {
      const Impl::Storage& st = m.storages[s];
      return !st.deferred || m.InPool(s) || !st.material;
    });
  }
  stats_.recycled_ops += static_cast<std::int64_t>(out.ops.size());
  stats_.recycled_storages += static_cast<std::int64_t>(out.storages.size());
  return out;
}

void Engine::FreeOp(OpId o, RecycledIds& out) {
  Impl& m = *impl_;
  Impl::Op& op = m.ops[o];
  for (const TensorId u : m.Outputs(op)) {
    const StorageIndex s = m.tensors[u].storage;
    std::vector<TensorId>& ts = m.storages[s].tensors;
    ts.erase(std::find(ts.begin(), ts.end(), u));  // keeps the order: tensors[0] is the storage's root
    m.tensors[u] = Impl::Tensor{};
    m.free_tensors.push_back(u);
    out.tensors.push_back(u);
    if (ts.empty()) FreeStorage(s, out);
  }
  m.io_garbage += op.in_count + op.out_count;
  op = Impl::Op{};
  op.free = true;
  op.inert = true;
  m.free_ops.push_back(o);
  out.ops.push_back(o);
}

// s is dead and has no tensor left: it leaves the union-find and its slot is cleared, but for its adjacency lists,
// which DetachFreedStorages clears once every storage of this Recycle is freed.
void Engine::FreeStorage(StorageIndex s, RecycledIds& out) {
  Impl& m = *impl_;
  if (m.eq_classes) m.LeaveNode(s);
  if (m.regions) {
    m.fwd[s] = Region();
    m.rev[s] = Region();
  }
  m.ResetStorage(s);
  m.storages[s].dead = true;
  m.storages[s].free = true;
  m.state[s] = kRegionDead;  // walks that still reach it (a region built before it died) ignore it
  m.costs[s] = 0;
  m.weight_mark[s] = Impl::kOut;
  m.free_storages.push_back(s);
  out.storages.push_back(s);
}

// The freed storages leave their neighbours' adjacency lists: one pass per neighbour, whatever the number of freed
// storages it lists (a weight read by every op of the run lists each of them: erasing them one by one would be
// quadratic).
void Engine::DetachFreedStorages(std::span<const StorageIndex> freed) {
  Impl& m = *impl_;
  std::vector<StorageIndex> touched;
  for (const StorageIndex s : freed) {
    for (const StorageIndex p : m.storage_parents[s]) {
      if (!m.storages[p].free) touched.push_back(p);
    }
    for (const StorageIndex c : m.storage_children[s]) {
      if (!m.storages[c].free) touched.push_back(c);
    }
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  auto freed_slot = [&](StorageIndex x) { return m.storages[x].free; };
  for (const StorageIndex n : touched) {
    std::erase_if(m.storage_parents[n], freed_slot);
    std::erase_if(m.storage_children[n], freed_slot);
  }
  for (const StorageIndex s : freed) {
    engine_internal::KeepSmallCapacity(m.storage_parents[s]);
    engine_internal::KeepSmallCapacity(m.storage_children[s]);
  }
}

// The ops' input and output lists live in two flat arrays; a freed op (or an inert op's inputs) leaves a hole.
void Engine::CompactOpLists() {
  Impl& m = *impl_;
  const std::size_t total = m.op_inputs.size() + m.op_outputs.size();
  if (m.io_garbage < kCompactFloor || 2 * m.io_garbage < total) return;
  std::vector<TensorId> inputs, outputs;
  inputs.reserve(m.op_inputs.size() - std::min(m.io_garbage, m.op_inputs.size()));
  outputs.reserve(m.op_outputs.size());
  for (Impl::Op& op : m.ops) {
    if (op.free) continue;
    const auto in = m.Inputs(op);
    const auto outs = m.Outputs(op);
    op.in_begin = static_cast<std::uint32_t>(inputs.size());
    inputs.insert(inputs.end(), in.begin(), in.end());
    op.out_begin = static_cast<std::uint32_t>(outputs.size());
    outputs.insert(outputs.end(), outs.begin(), outs.end());
  }
  m.op_inputs.swap(inputs);
  m.op_outputs.swap(outputs);
  m.io_garbage = 0;
}

// Each eviction adds a union-find node and nodes are never removed from their class, so the structure grows with
// the number of evictions. Rebuilt once its nodes outnumber the storage slots twice over: one node per storage that
// has a current node, the classes and their values (EqClasses::RootValue) kept exactly, so no score changes.
void Engine::CompactEqClasses() {
  Impl& m = *impl_;
  if (!m.eq_classes || m.eq.size() < kCompactFloor || m.eq.size() < 2 * m.storages.size()) return;
  EqClasses eq;
  std::vector<StorageIndex> node_storage;
  std::vector<std::vector<std::int32_t>> node_members;
  std::vector<std::int32_t> node_live;
  absl::flat_hash_map<std::int32_t, std::int32_t> new_root;  // old root -> new root
  for (StorageIndex s = 0; s < m.storages.size(); ++s) {
    Impl::Storage& st = m.storages[s];
    if (st.ecn < 0) continue;
    if (st.dead) {  // never read again through its node (EqSum skips dead neighbours)
      st.ecn = -1;
      continue;
    }
    const std::int32_t root = m.eq.Find(st.ecn);
    auto [it, first] = new_root.try_emplace(root, 0);
    const std::int32_t node = eq.Add(first ? m.eq.RootValue(root) : 0);
    node_storage.push_back(s);
    node_members.emplace_back(1, node);
    node_live.push_back(1);
    if (first) {
      it->second = node;
    } else {
      eq.Merge(node, it->second);  // adds 0 to the class's value
      node_members[it->second].push_back(node);
      std::vector<std::int32_t>().swap(node_members[node]);
      ++node_live[it->second];
      node_live[node] = 0;
    }
    st.ecn = node;
  }
  m.eq = std::move(eq);
  m.node_storage.swap(node_storage);
  m.node_members.swap(node_members);
  m.node_live.swap(node_live);
}

}  // namespace remat
