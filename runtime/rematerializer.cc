// Rematerializer: the frame stack that runs an op and replays what its inputs need (rematerializer.h).
#include "runtime/rematerializer.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/engine_impl.h"
#include "runtime/memory_report.h"

namespace remat {

Rematerializer::Rematerializer(Engine& engine) : engine_(engine) {}

absl::Status Rematerializer::Run(TensorId target, OpId op, bool remat) {
  stack_.push_back({target, op, remat, 0, 0, 0, 0});
  return RunOutermost();
}

absl::Status Rematerializer::Gather(OpId op) {
  stack_.push_back({kNone, op, false, 0, 0, 0, 0});
  return RunOutermost();
}

absl::Status Rematerializer::RunOutermost() {
  const Frame first = stack_.back();
  const bool outermost = stack_.size() == 1;
  const std::int64_t replays_before = engine_.stats_.rematerializations;
  absl::Status status = RunFrames();
  if (status.ok() || !absl::IsResourceExhausted(status) || !outermost || gather_late_ ||
      !engine_.options_.retry_gathering_late) {
    return status;
  }
  // What the first try replayed stays resident or evictable: the second starts from there. Gathering late can
  // replay a resident input it did not lock again and again, deep chains inside deep chains: past a bound on its
  // replays (kLateReplaysPerFirst times the first try's, at least kLateReplaysMin) it gives up, out of memory as the
  // first try was, rather than thrash.
  const std::int64_t first_replays = engine_.stats_.rematerializations - replays_before;
  late_replay_limit_ = engine_.stats_.rematerializations +
                       std::max<std::int64_t>(kLateReplaysMin, kLateReplaysPerFirst * first_replays);
  gather_late_ = true;
  stack_.push_back({first.t, first.op, first.remat, 0, 0, 0, 0});
  absl::Status late = RunFrames();
  gather_late_ = false;
  if (late.ok()) ++engine_.stats_.late_gathers;
  // Still out of memory: the first try's report, which says where the usual order ran out.
  return late.ok() || !absl::IsResourceExhausted(late) ? late : status;
}

bool Rematerializer::GatheringCallersOp() const { return stack_.size() == 1 && stack_.back().t == kNone; }

Rematerializer::Where Rematerializer::where() const {
  Where w;
  if (stack_.empty()) {
    w.op = running_kernel_;
    return w;
  }
  w.op = stack_.front().op;
  w.bringing_back = stack_.front().remat;
  w.replays = static_cast<std::size_t>(
      std::count_if(stack_.begin(), stack_.end(), [](const Frame& f) { return f.remat; }));
  if (w.replays > 0 && stack_.back().remat && stack_.size() > 1) w.replaying = stack_.back().op;
  return w;
}

absl::Status Rematerializer::RunFrames() {
  Engine::Impl& m = *engine_.impl_;
  const std::size_t base = stack_.size() - 1;
  const std::size_t pending_begin = pending_.size();
  const std::size_t log_begin = lock_log_.size();
  absl::Status status = RunFramesFrom(base);
  if (!status.ok()) {
    // Leave the engine usable (a caught OOM must not poison it): release the locks the unfinished frames hold.
    for (std::size_t i = lock_log_.size(); i > log_begin; --i) m.Unlock(lock_log_[i - 1]);
    lock_log_.resize(log_begin);
    pending_.resize(pending_begin);
    stack_.resize(base);
  }
  return status;
}

absl::Status Rematerializer::RunFramesFrom(std::size_t base) {
  Engine::Impl& m = *engine_.impl_;
  EngineStats& stats = engine_.stats_;
  const EngineOptions& options = engine_.options_;
  while (stack_.size() > base) {
    Frame& f = stack_.back();
    const Engine::Impl::Op& op = m.ops[f.op];
    std::span<const TensorId> inputs = m.Inputs(op);
    if (f.stage == 0) {
      f.lock_begin = static_cast<std::uint32_t>(lock_log_.size());
      for (TensorId p : inputs) m.SetLastAccess(m.tensors[p].storage, stats.clock);
      if (!gather_late_) {
        for (TensorId p : inputs) {
          if (m.tensors[p].defined) {
            m.Lock(m.tensors[p].storage);
            lock_log_.push_back(m.tensors[p].storage);
          }
        }
      }
      f.list_begin = static_cast<std::uint32_t>(pending_.size());
      for (TensorId p : inputs) {
        if (!m.tensors[p].defined) pending_.push_back(p);
      }
      if (gather_late_) {  // the resident ones after: stage 1 locks each, or replays it if it was evicted meanwhile
        for (TensorId p : inputs) {
          if (m.tensors[p].defined) pending_.push_back(p);
        }
      }
      f.list_end = static_cast<std::uint32_t>(pending_.size());
      f.next = f.list_begin;
      f.stage = 1;
    }
    if (f.stage == 2) {  // a child frame just made scratch[next] defined
      m.Lock(m.tensors[pending_[f.next]].storage);
      lock_log_.push_back(m.tensors[pending_[f.next]].storage);
      ++f.next;
      f.stage = 1;
    }
    if (f.stage == 1) {
      bool pushed = false;
      while (f.next < f.list_end) {
        TensorId p = pending_[f.next];
        if (!m.tensors[p].defined && m.storages[m.tensors[p].storage].paged) {
          // Pushes no frame: f stays valid.
          absl::StatusOr<bool> in =
              m.pager->PageIn(m.tensors[p].storage, /*prefetch=*/false, /*may_reclaim=*/true);
          if (!in.ok()) return in.status();
        }
        if (!m.tensors[p].defined) {
          f.stage = 2;
          // Without view replay, a view comes back with its storage: replay the storage's producer instead.
          TensorId producer = options.replay_views ? p : m.storages[m.tensors[p].storage].tensors[0];
          stack_.push_back({producer, m.tensors[producer].op, true, 0, 0, 0, 0});  // invalidates f
          pushed = true;
          break;
        }
        m.Lock(m.tensors[p].storage);
        lock_log_.push_back(m.tensors[p].storage);
        ++f.next;
      }
      if (pushed) continue;
    }
    // All inputs resident and locked: wait for their page-ins, make room and execute.
    Frame frame = stack_.back();
    m.pager->WaitForInputs(frame.op);
    if (frame.t == kNone) {  // BeginOp: the caller runs the op; inputs stay locked until EndOp/AbortOp
      pending_.resize(frame.list_begin);
      lock_log_.resize(frame.lock_begin);
      stack_.pop_back();
      continue;
    }
    const TensorId t = frame.t;
    const OpId op_id = frame.op;
    if (gather_late_ && frame.remat && stats.rematerializations >= late_replay_limit_) {
      return absl::ResourceExhaustedError("remat: gathering late gave up: too many replays");
    }
    std::span<const TensorId> outs = m.Outputs(m.ops[op_id]);
    const std::int64_t total = m.ops[op_id].total_size;
    if (options.mode == AccountingMode::kCounter) {
      if (absl::Status s = m.pressure->MakeRoomCounter(total, m.names[m.ops[op_id].name]); !s.ok()) return s;
    }
    // Execute: the op's outputs are t and its siblings.
    resident_siblings_.clear();
    m.remat_storages.clear();
    for (TensorId u : outs) {
      if (u != t && m.tensors[u].defined) resident_siblings_.push_back(u);
    }
    // Siblings the replay does not bring back (the executor drops their results): a paged pinned one keeps its
    // host copy (a storage pinned for good may no longer be reproducible), and a dead one is needed by nothing (its
    // slot may be recycled: it must hold no memory).
    auto kept_out = [&](TensorId u) {
      const Engine::Impl::Storage& us = m.storages[m.tensors[u].storage];
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
    stats.clock += m.ops[op_id].cost;
    if (frame.remat) {
      stats.remat_compute += m.ops[op_id].cost;
      ++stats.rematerializations;
    } else {
      stats.model_compute += m.ops[op_id].cost;
    }
    if (options.mode == AccountingMode::kCounter) {
      stats.used_bytes += total;
      stats.peak_bytes = std::max(stats.peak_bytes, stats.used_bytes);
    }
    fresh_.assign(m.remat_storages.begin(), m.remat_storages.end());
    // Arena mode: placing the fresh outputs may make room, and the op's outputs that are still resident (replay of
    // a multi-output op) must not be the victims. Counter mode made room above (and keeps the prototype's pool
    // order, which locking would change).
    const bool lock_siblings = options.mode == AccountingMode::kArena;
    if (lock_siblings) {
      for (TensorId u : resident_siblings_) m.Lock(m.tensors[u].storage);
    }
    const OpId outer_kernel = running_kernel_;  // kNoKernel: replays run inside BeginOp, before the op's kernel
    running_kernel_ = op_id;
    absl::Status executed = engine_.executor_->Execute(engine_, op_id, frame.remat, fresh_);
    running_kernel_ = outer_kernel;
    if (lock_siblings) {
      for (TensorId u : resident_siblings_) m.Unlock(m.tensors[u].storage);
    }
    if (!executed.ok()) {
      if (!absl::IsResourceExhausted(executed)) return executed;
      return MemoryReport(engine_).Annotate(executed.message(), "");
    }
    if (options.mode == AccountingMode::kArena) {
      for (StorageIndex s : m.remat_storages) stats.used_bytes += m.storages[s].size;
      engine_.NotePeak();
    }
    for (StorageIndex s : m.remat_storages) {
      if (m.storages[s].paged) m.pager->DropCopy(s);  // recomputed: the host copy is stale weight
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
    if (!options.replay_views) {
      for (StorageIndex s : m.remat_storages) {
        for (TensorId u : m.storages[s].tensors) m.tensors[u].defined = true;
      }
    }
    if (options.mode == AccountingMode::kCounter) {
      for (TensorId u : resident_siblings_) stats.used_bytes -= m.tensors[u].size;
      stats.used_bytes -= kept_out_bytes;
    }
    engine_.AfterCompute();
    for (TensorId p : m.Inputs(m.ops[op_id])) m.Unlock(m.tensors[p].storage);
    lock_log_.resize(frame.lock_begin);
    pending_.resize(frame.list_begin);
    stack_.pop_back();
    if (options.remat_limit >= 0 && stats.remat_compute + stats.stall_ns > options.remat_limit) {
      return absl::AbortedError(absl::StrFormat("thrashing: replayed %d ns + transfer stall %d ns > limit %d ns",
                                                stats.remat_compute, stats.stall_ns, options.remat_limit));
    }
  }
  return absl::OkStatus();
}

}  // namespace remat
