// Engine implementation: construction, constants and ops (Call, BeginOp/EndOp), references and release, dead
// storages, pins, deferral, eviction, and the forwards to the parts. The records are Engine::Impl
// (engine_impl.h); the parts are the rematerializer (rematerializer.h), the pager (pager.h) and the defragmenter
// (defragmenter.h), the pressure resolver (pressure_resolver.h) and the memory report (memory_report.h); choosing
// victims and the policies' StorageView is engine_choice.cc, recycling engine_recycle.cc (runtime/README.md).
#include "runtime/engine.h"

#include <algorithm>
#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "policies/costly_ops.h"
#include "runtime/engine_impl.h"
#include "runtime/memory_report.h"

namespace remat {

Engine::Engine(EngineOptions options, Executor* executor)
    : impl_(std::make_unique<Impl>()), options_(options), executor_(executor) {
  impl_->rng.seed(options_.seed);
  impl_->defrag.emplace(*impl_, impl_->pool, *this, stats_, options_.relocate);
  impl_->remat.emplace(*this);
  impl_->pager.emplace(*this, options_.paging);
  impl_->pressure.emplace(*this);
  if (options_.policy != nullptr) {
    PolicyFeatures f = options_.policy->features();
    impl_->nb.Configure(f.regions, f.eq_classes, options_.policy->HasStalenessWeight());
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
  const OpId id = m.NewOpSlot();
  Impl::Op& op = m.ops[id];
  op.cost = cost;
  op.name = m.Name(name);
  if (op.name >= m.costly_by_name.size()) m.costly_by_name.resize(m.names.size(), 0);
  std::uint8_t& costly = m.costly_by_name[op.name];
  if (costly == 0) costly = IsCostlyOp(name) ? 2 : 1;
  op.costly = costly == 2;
  op.in_begin = static_cast<std::uint32_t>(m.op_inputs.size());
  op.in_count = static_cast<std::uint32_t>(inputs.size());
  m.op_inputs.insert(m.op_inputs.end(), inputs.begin(), inputs.end());
  for (const TensorId p : inputs) ++m.tensors[p].consumers;
  op.out_begin = static_cast<std::uint32_t>(m.op_outputs.size());
  return id;
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
    const TensorId t = m.NewTensorSlot();
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
      s = m.NewStorageSlot();
      m.storages[s].size = spec.bytes;
      // EngineOptions::last_resort_bytes (0: none, empty storages included)
      m.storages[s].deferred = options_.last_resort_bytes > 0 && spec.bytes <= options_.last_resort_bytes;
      tensor.size = spec.bytes;
      op.total_size += spec.bytes;
      m.nb.NewStorage(s);
    }
    tensor.storage = s;
    Impl::Storage& st = m.storages[s];
    bool op_seen = false;
    for (TensorId u : st.tensors) op_seen = op_seen || m.tensors[u].op == op_id;
    if (!op_seen) {
      st.compute += op.cost;
      m.nb.AddCompute(s, op.cost);  // a view's base: touched with the op's edges below (views have inputs)
    }
    st.tensors.push_back(t);
    st.ext_refs += 1;
    m.tensors[t] = tensor;
    m.op_outputs.push_back(t);
  }
  {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      StorageIndex su = m.tensors[m.op_outputs[op.out_begin + i]].storage;
      for (TensorId p : inputs) {
        m.nb.AddEdge(su, m.tensors[p].storage);
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
  if (m.nb.eq_classes()) m.nb.LeaveNode(s);
  m.nb.Touch(s);
  if (address != 0) SetAddress(s, address);
  Pin(t);
  m.storages[s].constant = true;
  m.constant_bytes += bytes;
  stats_.used_bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.used_bytes);
  return t;
}

absl::Status Engine::AdoptCopy(TensorId t, std::uintptr_t address) {
  Impl& m = *impl_;
  const StorageIndex s = m.tensors[t].storage;
  Impl::Storage& st = m.storages[s];
  if (st.material || st.paged || st.pinned || st.dead || !st.computed || st.locks != 0) {
    return absl::FailedPreconditionError(absl::StrCat("storage ", s, " is not an evicted value a copy can restore"));
  }
  m.SetMaterial(s, true);
  for (TensorId u : st.tensors) m.tensors[u].defined = true;  // the whole storage's bytes are back
  if (address != 0) SetAddress(s, address);
  stats_.used_bytes += st.size;
  m.SetLastAccess(s, stats_.clock);
  NotePeak();
  m.remat_storages.assign(1, s);
  AfterCompute();  // into the pool (its locks are 0: the op that wrote it in place has ended); neighbourhoods
  m.remat_storages.clear();
  return absl::OkStatus();
}

// A replay of `target` (or its storage's root, without view replay) through the rematerializer; a paged storage
// is paged in instead, and waited for.
absl::Status Engine::Rematerialize(TensorId target) {
  Impl& m = *impl_;
  if (m.tensors[target].defined) return absl::OkStatus();
  if (StorageIndex s = m.tensors[target].storage; m.storages[s].paged) {
    absl::StatusOr<bool> in = m.pager->PageIn(s, /*prefetch=*/false, /*may_reclaim=*/true);
    if (!in.ok()) return in.status();
    if (m.storages[s].ready_at > stats_.clock) {  // the caller wants it on the device now
      stats_.stall_ns += m.storages[s].ready_at - stats_.clock;
      stats_.clock = m.storages[s].ready_at;
    }
    if (m.tensors[target].defined) return absl::OkStatus();
  }
  if (!options_.replay_views) target = m.storages[m.tensors[target].storage].tensors[0];
  return m.remat->Run(target, m.tensors[target].op, /*remat=*/true);
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
    m.recycle_ops.push_back(op_id);  // nothing to recompute: inert at once
    return outs;
  }
  // A first execution, driven like a replay.
  if (absl::Status run = m.remat->Run(outs[0], op_id, /*remat=*/false); !run.ok()) return run;
  for (TensorId t : outs) m.SetLastAccess(m.tensors[t].storage, stats_.clock);
  return outs;
}

absl::StatusOr<OpId> Engine::BeginOp(std::span<const TensorId> inputs, std::string_view name) {
  Impl& m = *impl_;
  OpId op_id = NewOp(inputs, 0, name);
  if (absl::Status run = m.remat->Gather(op_id); !run.ok()) {  // gather and lock the inputs only
    m.recycle_ops.push_back(op_id);  // never ran: nothing can recompute from it
    return run;
  }
  m.remat->set_running_kernel(op_id);  // the caller runs it now
  m.open_op = op_id;
  return op_id;
}

absl::StatusOr<std::span<const TensorId>> Engine::EndOp(OpId op_id, std::span<const OutputSpec> outputs,
                                                        std::int64_t cost) {
  Impl& m = *impl_;
  if (op_id != m.open_op || m.ops[op_id].out_count != 0) {
    return absl::FailedPreconditionError("EndOp must close the most recent BeginOp");
  }
  m.ops[op_id].cost = cost;
  // The kernel has run, but its inputs and outputs keep their addresses until EndOp has registered them.
  absl::Cleanup kernel_done = [&m] { m.remat->set_running_kernel(kNoKernel); };
  std::vector<OutputSpec>& specs = end_specs_;  // in-place outputs get their bytes and address
  specs.assign(outputs.begin(), outputs.end());
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
  m.open_op = kNone;
  std::span<const TensorId> outs = m.Outputs(m.ops[op_id]);
  // Recomputable in-place: the written storage's bytes (and address) now hold the new value, a fresh storage made
  // by this op; the old value becomes a memory-less evicted storage that keeps its producer.
  // Writing a constant in place (an optimizer step on a parameter): the new value is a constant too, and the old
  // value is gone for good (nothing can reproduce it), so it leaves the graph.
  std::vector<TensorId>& new_constants = end_new_constants_;  // new values of constants written in place
  new_constants.clear();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].in_place_of < 0) continue;
    StorageIndex old = m.tensors[m.Inputs(m.ops[op_id])[specs[i].in_place_of]].storage;
    if (m.storages[old].pinned) {
      new_constants.push_back(outs[i]);
      Impl::Storage& st = m.storages[old];
      m.SetMaterial(old, false);
      stats_.used_bytes -= st.size;
      st.has_address = false;
      m.MarkDead(old);
      if (st.constant) m.constant_bytes -= st.size;  // a result pinned for good was never counted as a constant
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
  for (TensorId c : new_constants) {
    Pin(c);
    const StorageIndex s = m.tensors[c].storage;
    m.storages[s].constant = true;
    m.constant_bytes += m.storages[s].size;
  }
  if (outs.empty()) m.recycle_ops.push_back(op_id);
  for (TensorId p : m.Inputs(m.ops[op_id])) m.Unlock(m.tensors[p].storage);
  for (TensorId t : outs) m.SetLastAccess(m.tensors[t].storage, stats_.clock);
  return outs;
}

void Engine::AbortOp(OpId op_id) {
  Impl& m = *impl_;
  m.remat->set_running_kernel(kNoKernel);
  if (m.open_op == op_id) m.open_op = kNone;
  for (TensorId p : m.Inputs(m.ops[op_id])) m.Unlock(m.tensors[p].storage);
  m.recycle_ops.push_back(op_id);  // produced nothing
}

void Engine::Retain(TensorId t) {
  impl_->tensors[t].ext_refs += 1;
  Impl::Storage& st = impl_->storages[impl_->tensors[t].storage];
  st.ext_refs += 1;
  st.released_resident = false;  // referenced again: an ordinary resident storage (its list entry is skipped)
}

void Engine::Release(TensorId t, bool keep_if_replays_read) {
  Impl& m = *impl_;
  StorageIndex s = m.tensors[t].storage;
  Impl::Storage& st = m.storages[s];
  if (m.tensors[t].ext_refs <= 0) return;  // already released: a second release is a no-op
  m.tensors[t].ext_refs -= 1;
  st.ext_refs -= 1;
  if (keep_if_replays_read && st.ext_refs == 0 && st.material && !st.pinned && st.locks == 0 &&
      ReadByPendingReplay(s)) {
    st.released_resident = true;
    m.released_list.push_back(s);
  } else if (st.ext_refs == 0 && st.material && !st.pinned && st.locks == 0) {
    (void)Evict(s);
    stats_.evictions -= 1;
    stats_.release_evictions += 1;
  } else if (st.ext_refs == 0 && st.paged && !st.pinned && st.locks == 0) {
    // Its host copy goes as a resident one's memory would; it stays recomputable.
    impl_->pager->DropCopy(s);
    MarkEvicted(s, /*held_memory=*/false);
    stats_.release_evictions += 1;
  } else if (st.ext_refs == 0 && st.pinned && options_.free_released_constants &&
             (!options_.free_dead || options_.caller_guards_released_constants)) {
    // Otherwise FreeDead below gives a released constant's bytes back once nothing can read it any more (its
    // children are dead or pinned); dropping them before would make a replay of a child recompute the constant.
    DropPinnedBytes(s);
  }
  if (options_.free_dead && st.ext_refs == 0) FreeDead(s);
}

// Whether a storage computed from s directly was evicted while the program still refers to it: its replay would
// read s. (Storages evicted at their release do not count: they may never be needed, and an unconstrained run, which
// evicts nothing under pressure, must hold what eager eviction holds.)
bool Engine::ReadByPendingReplay(StorageIndex s) const {
  const Impl& m = *impl_;
  for (const StorageIndex c : m.nb.Children(s)) {
    const Impl::Storage& cs = m.storages[c];
    if (c != s && cs.ext_refs > 0 && !cs.dead && !cs.pinned && !cs.material && !cs.paged) return true;
  }
  return false;
}

std::int64_t Engine::DropReleased() {
  Impl& m = *impl_;
  std::int64_t dropped = 0;
  std::vector<StorageIndex> still_locked;
  for (const StorageIndex s : m.released_list) {
    Impl::Storage& st = m.storages[s];
    // Evicted, freed, paged out, pinned or referenced again since: no longer this list's.
    if (!st.released_resident || !st.material || st.pinned) continue;
    if (st.locks > 0) {  // read by the running op or replay: dropped at a later event
      still_locked.push_back(s);
      continue;
    }
    if (!Evict(s).ok()) continue;
    dropped += st.size;
    stats_.evictions -= 1;
    stats_.release_evictions += 1;
  }
  m.released_list.swap(still_locked);
  return dropped;
}

// A storage is dead when it has no external reference and every storage computed from it is dead or pinned (a
// pinned storage is never recomputed): no future op can read it and no replay can need it. That holds for pinned
// storages too. Dead storages leave the graph (they no longer count in neighbourhood costs); a resident one would be
// freed, but eager eviction on release has already dropped its memory.
void Engine::FreeDead(StorageIndex start) {
  Impl& m = *impl_;
  std::vector<StorageIndex> work;
  work.swap(free_dead_work_);
  work.clear();
  work.push_back(start);
  absl::Cleanup keep = [&] { free_dead_work_.swap(work); };
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
    for (StorageIndex c : m.nb.Children(x)) {
      if (c == x || m.storages[c].dead || m.storages[c].pinned) continue;
      children_dead = false;  // one live child is enough: no need to look at the rest
      break;
    }
    if (!children_dead) continue;
    if (st.pinned) {  // not evictable: its memory leaves the books as a released constant's does
      DropPinnedBytes(x);
    } else if (st.material) {
      (void)Evict(x);
      stats_.evictions -= 1;
      stats_.release_evictions += 1;
    } else if (st.paged) {
      impl_->pager->DropCopy(x);
      m.SetMaterial(x, false);
    }
    m.MarkDead(x);
    ++stats_.freed_storages;
    for (StorageIndex p : m.nb.Parents(x)) work.push_back(p);
  }
}

void Engine::DropPinnedBytes(StorageIndex s) {
  Impl& m = *impl_;
  Impl::Storage& st = m.storages[s];
  if (st.constant && (st.material || st.paged)) m.constant_bytes -= st.size;  // a constant's bytes leave the books
  if (st.material) {
    if (st.has_address) executor_->DropPinned(*this, s);  // arena mode: its block goes back
    st.has_address = false;
    m.SetMaterial(s, false);
    stats_.used_bytes -= st.size;
    for (TensorId u : st.tensors) m.tensors[u].defined = false;
  } else if (st.paged) {
    impl_->pager->DropCopy(s);
    m.SetMaterial(s, false);
  }
}

void Engine::NotePeak() {
  if (options_.mode == AccountingMode::kArena && options_.arena != nullptr) {
    stats_.peak_bytes = std::max<std::int64_t>(stats_.peak_bytes, options_.arena->PeakBudgetedBytes());
  } else {
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.used_bytes);
  }
  // A page-out or page-in moves bytes between the tiers without changing the sum: only new bytes (here) raise it.
  stats_.resident_and_host_peak_bytes =
      std::max(stats_.resident_and_host_peak_bytes, stats_.used_bytes + stats_.host_used_bytes);
}

void Engine::Defer(TensorId t) {
  Impl& m = *impl_;
  const StorageIndex s = m.tensors[t].storage;
  Impl::Storage& st = m.storages[s];
  if (st.pinned || st.deferred) return;
  st.deferred = true;
  if (m.InPool(s)) {
    m.PoolRemove(s);
    m.PoolAppend(s);  // into deferred_list
  }
}

void Engine::Pin(TensorId t) {
  Impl& m = *impl_;
  StorageIndex s = m.tensors[t].storage;
  m.storages[s].deferred = false;
  if (m.storages[s].pinned) return;
  m.Lock(s);
  m.storages[s].pinned = true;
  m.storages[s].released_resident = false;  // never dropped now (its list entry is skipped)
  m.settled.push_back(s);
  if (options_.free_dead) newly_pinned_.push_back(s);
}

void Engine::Fix(TensorId t) {
  Pin(t);
  impl_->storages[impl_->tensors[t].storage].fixed = true;
}

absl::Status Engine::Hold(TensorId t) {
  Impl& m = *impl_;
  if (!m.tensors[t].defined || m.storages[m.tensors[t].storage].paged) {
    if (absl::Status status = Rematerialize(t); !status.ok()) return status;
  }
  const StorageIndex s = m.tensors[t].storage;
  m.Lock(s);  // out of the pool: neither evicted nor paged out
  ++m.storages[s].holds;  // and not moved (RelocateIdle, Compact)
  return absl::OkStatus();
}

void Engine::Unhold(TensorId t) {
  Impl& m = *impl_;
  const StorageIndex s = m.tensors[t].storage;
  --m.storages[s].holds;
  m.Unlock(s);
  // Died while held (a pinned value written in place): Recycle passed it over, so it looks again.
  if (m.storages[s].holds == 0 && m.storages[s].dead) m.settled.push_back(s);
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
  st.released_resident = false;
  if (held_memory) stats_.used_bytes -= st.size;
  m.PoolRemove(s);
  for (TensorId t : st.tensors) m.tensors[t].defined = false;
  st.has_address = false;
  m.nb.AbsorbEvicted(s, [&](StorageIndex x) { return m.storages[x].pinned; });
  m.nb.Evicted(s, st.compute, m.pool.size(), [&](StorageIndex n) { return m.OutOfNeighbourhood(n); });
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
    for (const StorageIndex p : m.nb.Parents(s)) FreeDead(p);
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
EngineTables Engine::tables() const {
  const Impl& m = *impl_;
  return {m.ops.size(), m.tensors.size(), m.storages.size(), m.nb.union_find_nodes(), m.op_inputs.size() + m.op_outputs.size()};
}

// The storages in impl_->remat_storages just became resident: they join the pool and the incremental structures
// learn it (regions rebuilt around them, their union-find classes lose their cost).
void Engine::AfterCompute() {
  Impl& m = *impl_;
  for (StorageIndex s : m.remat_storages) m.PoolAppend(s);
  m.nb.RebuildAround(m.remat_storages, [&](StorageIndex x) { return m.storages[x].pinned; });
  for (StorageIndex s : m.remat_storages) m.nb.Resident(s, m.storages[s].compute, m.pool.size());
}

bool Engine::Paged(StorageIndex s) const { return impl_->storages[s].paged; }
std::int64_t Engine::ReadyAt(StorageIndex s) const { return impl_->storages[s].ready_at; }
bool Engine::PrefersPaging(StorageIndex s) const { return impl_->pager->PrefersPaging(s); }
std::int64_t Engine::LinkFreeAt() const { return impl_->pager->link().OutFreeAt(); }
std::int64_t Engine::TransferNs(std::int64_t bytes) const { return impl_->pager->link().TransferNs(bytes); }

absl::Status Engine::PageOut(StorageIndex s) {
  if (s >= impl_->storages.size()) return absl::InvalidArgumentError(absl::StrCat("no storage ", s));
  if (stats_.host_used_bytes > options_.paging.host_budget - impl_->storages[s].size) {
    return absl::ResourceExhaustedError(absl::StrCat("storage ", s, " does not fit the host budget"));
  }
  return impl_->pager->PageOut(s);
}

absl::StatusOr<bool> Engine::Prefetch(TensorId t) {
  Impl& m = *impl_;
  if (t >= m.tensors.size()) return absl::InvalidArgumentError(absl::StrCat("no tensor ", t));
  return m.pager->PageIn(m.tensors[t].storage, /*prefetch=*/true, /*may_reclaim=*/false);
}

absl::StatusOr<int> Engine::PrefetchAhead(std::span<const TensorId> upcoming, bool make_room) {
  return impl_->pager->PrefetchAhead(upcoming, make_room);
}

absl::StatusOr<bool> Engine::MakeRoom(Arena& arena, std::size_t bytes) {
  return impl_->pressure->MakeRoom(arena, bytes);
}
absl::StatusOr<bool> Engine::MakeHoleForRetry() { return impl_->pressure->MakeHoleForRetry(); }
void Engine::NoteAllocation() { impl_->pressure->NoteAllocation(); }

std::string Engine::DescribeMemory() { return MemoryReport(*this).Describe(); }
std::int64_t Engine::UnknownArenaBytes() const { return MemoryReport(*this).UnknownArenaBytes(); }

}  // namespace remat
