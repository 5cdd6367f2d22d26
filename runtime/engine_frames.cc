// Engine: the rematerializer. Rematerialize and the op calls push frames on an explicit work stack (no C++
// recursion: a 100,000-op replay chain works); RunFramesFrom runs them: gather an op's inputs (replaying evicted
// ones through child frames, paging in paged ones), make room, call Executor::Execute (the only caller), mark the
// outputs resident (AfterCompute). engine.h's contract, "Semantics".
#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/engine.h"
#include "runtime/engine_impl.h"

namespace remat {

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
  absl::Status status = RunFramesFrom(base);
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
    // Siblings the replay does not bring back (the executor drops their results): a paged pinned one keeps its
    // host copy (a storage pinned for good may no longer be reproducible), and a dead one is needed by nothing (its
    // slot may be recycled: it must hold no memory).
    auto kept_out = [&](TensorId u) {
      const Impl::Storage& us = m.storages[m.tensors[u].storage];
      return (us.paged && us.pinned) || us.dead;
    };
    std::int64_t kept_out_bytes = 0;
    for (TensorId u : outs) {
      if (u == t || m.storages[m.tensors[u].storage].material) continue;
      if (kept_out(u)) {
        kept_out_bytes += m.tensors[u].size;
      } else {
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
      if (u == t || m.tensors[u].defined || kept_out(u)) continue;
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
      stats_.used_bytes -= kept_out_bytes;
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
  m.nb.RebuildAround(m.remat_storages, [&](StorageIndex x) { return m.storages[x].pinned; });
  for (StorageIndex s : m.remat_storages) m.nb.Resident(s, m.storages[s].compute, m.pool.size());
}

}  // namespace remat
