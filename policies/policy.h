// Policy: an eviction heuristic. Policies are pure: they score read-only views of candidate storages and pick
// victims; they never mutate engine state. The engine (runtime/) maintains whatever incremental structures a policy
// asks for through `features()` (evicted regions for e*, union-find classes for the eq approximation) and exposes
// them through StorageView.
//
// Contract:
//   - Score(view, s): lower means "evict first". Infinity is allowed (never preferred over a finite score).
//   - Choose(): the default scans the candidates in the given order, keeps the minimum with ties going to the LATER
//     candidate, and stops early at a score of exactly 0 (the DTR prototype's simulator does the same). With
//     `sample_sqrt`, ceil(sqrt(n)) candidates drawn uniformly (with the context's RNG) are scored instead; with
//     `ignore_small`, candidates below 1% of the mean candidate size are skipped (unless all are).
//   - Window policies (Coop) answer WindowCost() per storage (nullopt = barrier) for Arena::FindWindow.
//   - Policies must be thread-compatible: one instance may be used by several engines one at a time.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>

namespace remat {

using StorageId = std::uint64_t;

struct PolicyFeatures {
  bool regions = false;     // forward/backward evicted regions (e*, evicted ancestors)
  bool eq_classes = false;  // union-find classes of evicted storages
  bool addresses = false;   // needs arena addresses (adjacent free bytes, windows)
};

// Read-only facts about storages, as the engine sees them now.
class StorageView {
 public:
  virtual ~StorageView() = default;
  virtual std::int64_t Clock() const = 0;
  virtual std::int64_t Bytes(StorageId s) const = 0;
  virtual std::int64_t Compute(StorageId s) const = 0;      // c(s): summed cost of the ops producing it
  virtual std::int64_t LastAccess(StorageId s) const = 0;
  // How far s is from its use, the DTR family's staleness: by default the time since its last access; an engine that
  // knows the future (remat-sim --foresight) answers the ops until its next read instead (kNeverAgain when nothing
  // reads it again), so that what is needed soonest stays.
  static constexpr std::int64_t kNeverAgain = std::int64_t{1} << 60;
  virtual std::int64_t Staleness(StorageId s) const { return Clock() - LastAccess(s); }
  virtual bool Evictable(StorageId s) const = 0;            // resident, unlocked, not constant
  // Summed c over the evicted region reachable forward (children) and backward (parents). Needs `regions`.
  virtual std::int64_t RegionCompute(StorageId s) const = 0;
  // Summed c over the evicted region reachable backward only (evicted ancestors). Needs `regions`.
  virtual std::int64_t AncestorCompute(StorageId s) const = 0;
  // Summed value of the distinct union-find classes of s's evicted direct neighbours. Needs `eq_classes`.
  virtual std::int64_t EqClassCompute(StorageId s) const = 0;
  // Summed c of s's evicted direct neighbours (Coop's cost).
  virtual std::int64_t EvictedNeighbourCompute(StorageId s) const = 0;
  // Free bytes next to s's block in the arena (0 in counter mode). Needs `addresses`.
  virtual std::int64_t AdjacentFreeBytes(StorageId s) const = 0;
  // True when s was produced by a costly op (convolution, matmul, ...): Coop places it at the low end.
  virtual bool Costly(StorageId s) const = 0;
};

struct ChooseOptions {
  bool sample_sqrt = false;
  bool ignore_small = false;
};

struct ChooseContext {
  std::mt19937_64* rng = nullptr;    // for random choices and sampling; must be set if either is used
  std::int64_t* evaluations = nullptr;  // incremented once per scored candidate when set
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  virtual PolicyFeatures features() const { return {}; }
  virtual double Score(const StorageView& view, StorageId s) const = 0;
  // Index into `candidates` of the victim, or nullopt when there are none.
  virtual std::optional<std::size_t> Choose(const StorageView& view, std::span<const StorageId> candidates,
                                            const ChooseOptions& options, ChooseContext& context) const;
  // Optional dense fast path for scores of the form Score(v, s) = W(s) / staleness(s). A policy returning true from
  // HasStalenessWeight() promises, for every storage s with Bytes(s) >= 0 and staleness t = Clock - LastAccess > 0:
  //   - W = StalenessWeight(v, s) does not depend on the clock nor on last accesses: only on Bytes(s), Compute(s),
  //     EqClassCompute(s) and EvictedNeighbourCompute(s) (the engine recomputes W when one of those may change);
  //   - Score(v, s) is +infinity iff W is +infinity, 0 iff W == 0, negative iff W < 0, and otherwise
  //     |W / t - Score(v, s)| <= 1e-12 * |Score(v, s)| with W / t computed in double;
  //   - for t <= 0, Score(v, s) is +infinity;
  //   - window policies: WindowCost(v, s) is, bit for bit, W / t (double) when s is evictable and that is finite,
  //     nullopt otherwise.
  // The engine then keeps W per candidate in contiguous arrays and scans them (for the full scan only: no sampling,
  // no small-storage filter); scores near the minimum are re-checked with Score, so its choice is exactly Choose's
  // (same victim, same ties to the later candidate, same early stop at 0, same evaluation count).
  virtual bool HasStalenessWeight() const { return false; }
  virtual double StalenessWeight(const StorageView& view, StorageId s) const {
    return std::numeric_limits<double>::infinity();
  }
  // Window policies evict a contiguous run of blocks chosen by the arena's window search.
  virtual bool UsesWindows() const { return false; }
  virtual std::optional<double> WindowCost(const StorageView& view, StorageId s) const { return std::nullopt; }
};

// Staleness as the DTR prototype measures it: clock - last access.
inline double Staleness(const StorageView& view, StorageId s) {
  return static_cast<double>(view.Clock() - view.LastAccess(s));
}

// numerator / (bytes * staleness), infinity when the denominator is not positive. Computed in long double so that
// products of large byte counts and clocks keep their precision (the prototype used exact integers).
double CostDensity(std::int64_t numerator, std::int64_t bytes, std::int64_t staleness);

}  // namespace remat
