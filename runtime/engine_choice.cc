// Engine: choosing victims (the eviction pool's order, the policy's choice over the dense arrays, arena windows)
// and the StorageView the policies read (engine.h: Bytes, Compute, LastAccess, neighbourhood costs, ...).
#include "runtime/engine.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace remat {

std::vector<StorageIndex> Engine::PoolOrder() const {
  std::vector<StorageIndex> out;
  for (StorageIndex s = impl_->pool.Head(); s != kNone; s = impl_->pool.Next(s)) out.push_back(s);
  return out;
}

std::optional<StorageIndex> Engine::ChooseFromPool() {
  Impl& m = *impl_;
  if (plan_ != nullptr) {
    if (std::optional<StorageIndex> pick = PlannedVictim()) {
      ++stats_.plan_victims;
      return pick;
    }
    if (!m.pool.empty()) ++stats_.plan_fallbacks;
  }
  // The dense scan reads last accesses; with a known future the policy's own scan reads Staleness.
  if (m.nb.weights() && !options_.choose.sample_sqrt && !options_.choose.ignore_small && future_ == nullptr) {
    if (std::optional<StorageIndex> pick = DenseChoice()) return pick;
  }
  ChooseContext ctx{&m.rng, &stats_.heuristic_evaluations};
  m.candidates.clear();
  for (StorageIndex s = m.pool.Head(); s != kNone; s = m.pool.Next(s)) m.candidates.push_back(s);
  std::optional<std::size_t> pick = options_.policy->Choose(*this, m.candidates, options_.choose, ctx);
  if (!pick) return std::nullopt;
  return static_cast<StorageIndex>(m.candidates[*pick]);
}

// The candidate the plan holds out now that it brings back last; ties to the larger, then to the first in the
// dense pool (deterministic).
std::optional<StorageIndex> Engine::PlannedVictim() {
  Impl& m = *impl_;
  std::optional<StorageIndex> best;
  std::int64_t best_until = -1;
  std::int64_t best_bytes = -1;
  for (StorageIndex s : m.pool.Members()) {
    const std::int64_t until = plan_->OutUntil(s);
    if (until < 0) continue;
    const std::int64_t bytes = m.storages[s].size;
    if (until > best_until || (until == best_until && bytes > best_bytes)) {
      best = s;
      best_until = until;
      best_bytes = bytes;
    }
  }
  return best;
}

void Engine::RefreshWeights() {
  impl_->nb.RefreshWeights(impl_->pool,
                            [&](StorageIndex x) { return options_.policy->StalenessWeight(*this, x); });
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
  const std::span<const StorageIndex> members = m.pool.Members();
  const std::size_t n = members.size();
  if (n == 0 || m.pool.NegativeCount() > 0 || stats_.clock >= kExactDoubleLimit) return std::nullopt;
  RefreshWeights();
  const double clock = static_cast<double>(stats_.clock);
  const double inf = std::numeric_limits<double>::infinity();
  const double* w = m.pool.Weights();
  const double* last = m.pool.LastAccesses();
  const std::uint64_t* seq = m.pool.Sequence();
  const std::size_t chunks = (n + kScanChunk - 1) / kScanChunk;
  m.chunk_min.resize(chunks);
  const double qmin = ChunkMinima(w, last, n, clock, m.chunk_min.data());
  if (!(qmin >= 0)) return std::nullopt;  // a negative score (or NaN): the ordered default path
  std::size_t pick = 0;
  std::int64_t evaluated = static_cast<std::int64_t>(n);
  if (qmin == inf) {
    stats_.heuristic_evaluations += evaluated;
    return m.pool.Tail();
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
        const double exact = options_.policy->Score(*this, members[i]);
        if (!found || exact < best || (exact == best && seq[i] > seq[pick])) {
          best = exact;
          pick = i;
          found = true;
        }
      }
    }
  }
  stats_.heuristic_evaluations += evaluated;
  return members[pick];
}

std::optional<Window> Engine::ChooseWindow(Arena& arena, std::size_t bytes) {
  Impl& m = *impl_;
  std::int64_t evaluations = 0;
  std::optional<Window> window;
  if (m.nb.weights() && stats_.clock < kExactDoubleLimit && future_ == nullptr) {
    // Every evictable storage's window cost (W / staleness, bit for bit the policy's WindowCost by its contract)
    // into a per-storage array before the search, so the per-block callback is one copy; the pool's entries are
    // reset to nullopt (barrier) afterwards.
    RefreshWeights();
    if (m.window_cost.size() < m.storages.size()) m.window_cost.resize(m.storages.size());
    const double clock = static_cast<double>(stats_.clock);
    std::optional<double>* costs = m.window_cost.data();
    const std::span<const StorageIndex> members = m.pool.Members();
    const double* weight = m.pool.Weights();
    const double* last = m.pool.LastAccesses();
    for (std::size_t i = 0; i < members.size(); ++i) {
      const double t = clock - last[i];
      const double cost = weight[i] / t;
      if (t > 0 && std::isfinite(cost)) costs[members[i]] = cost;
    }
    static const std::optional<double> kBarrier;
    const std::size_t count = m.window_cost.size();
    window = arena.FindWindow(bytes, [&](const BlockInfo& block) -> std::optional<double> {
      evaluations += block.owner != kNoOwner;
      const OwnerId s = block.owner - 1;  // kNoOwner wraps around past `count`
      return s < count ? costs[s] : kBarrier;
    });
    for (StorageIndex s : m.pool.Members()) costs[s].reset();
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
  if (impl_->pool.empty()) return std::nullopt;
  return ChooseFromPool();
}

// StorageView.
std::int64_t Engine::Clock() const { return stats_.clock; }
std::int64_t Engine::Bytes(StorageId s) const { return impl_->storages[s].size; }
std::int64_t Engine::Compute(StorageId s) const { return impl_->storages[s].compute; }
std::int64_t Engine::LastAccess(StorageId s) const { return impl_->storages[s].last_access; }

std::int64_t Engine::Staleness(StorageId s) const {
  if (future_ == nullptr) return stats_.clock - impl_->storages[s].last_access;
  return future_->OpsUntilNextUse(static_cast<StorageIndex>(s));
}
bool Engine::Evictable(StorageId s) const { return s < impl_->storages.size() && impl_->pool.Contains(static_cast<StorageIndex>(s)); }
std::int64_t Engine::RegionCompute(StorageId s) const {
  if (!impl_->nb.regions()) return 0;
  return impl_->nb.Forward(s).compute + impl_->nb.Backward(s).compute;
}
std::int64_t Engine::AncestorCompute(StorageId s) const { return impl_->nb.regions() ? impl_->nb.Backward(s).compute : 0; }
std::int64_t Engine::EqClassCompute(StorageId s) const {
  Impl& m = *impl_;
  if (!m.nb.eq_classes()) return 0;
  return m.nb.EqSum(static_cast<StorageIndex>(s), [&](StorageIndex n) { return m.OutOfNeighbourhood(n); });
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
  for (StorageIndex n : m.nb.Parents(self)) visit(n);
  for (StorageIndex n : m.nb.Children(self)) visit(n);
  return sum;
}
std::int64_t Engine::AdjacentFreeBytes(StorageId s) const {
  const Impl::Storage& st = impl_->storages[s];
  // A stitching arena gives any evicted block's granules back wherever it lies: free neighbours are no advantage.
  if (options_.arena == nullptr || !st.has_address || options_.arena->stitched()) return 0;
  return static_cast<std::int64_t>(options_.arena->AdjacentFreeBytes(st.address));
}
bool Engine::Costly(StorageId s) const {
  const Impl::Storage& st = impl_->storages[s];
  return !st.tensors.empty() && impl_->ops[impl_->tensors[st.tensors[0]].op].costly;
}

}  // namespace remat
