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
  if (m.remat->busy()) return out;  // inside a call: frames hold ids
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
                 !m.InPool(tu.storage) && st.holds == 0;  // a holder's Unhold still names it
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
  // Released storages kept resident leave the list when evicted, freed or referenced again; without pressure their
  // entries would pile up.
  if (m.released_list.size() > kCompactFloor && m.released_list.size() > 2 * live_storages) {
    std::erase_if(m.released_list, [&](StorageIndex s) { return !m.storages[s].released_resident; });
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
  m.nb.FreeSlot(s);
  m.ResetStorage(s);
  m.storages[s].dead = true;
  m.storages[s].free = true;
  m.free_storages.push_back(s);
  out.storages.push_back(s);
}

// The freed storages leave their neighbours' adjacency lists (NeighbourhoodCosts::DetachFreed).
void Engine::DetachFreedStorages(std::span<const StorageIndex> freed) {
  Impl& m = *impl_;
  m.nb.DetachFreed(freed, [&](StorageIndex x) { return m.storages[x].free; });
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
// the number of evictions: compacted once its nodes outnumber the storage slots twice over (no score changes).
void Engine::CompactEqClasses() {
  Impl& m = *impl_;
  m.nb.MaybeCompactClasses(kCompactFloor, m.storages.size(), [&](StorageIndex s) { return m.storages[s].dead; });
}

}  // namespace remat
