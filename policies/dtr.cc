#include "policies/dtr.h"

#include <limits>

namespace remat {
namespace {

// CostDensity (policies/policy.cc), inlined for the batch loop: the same long double arithmetic, bit for bit.
inline double CostDensityInline(std::int64_t numerator, std::int64_t bytes, std::int64_t staleness) {
  long double denominator = static_cast<long double>(bytes) * static_cast<long double>(staleness);
  if (!(denominator > 0)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(static_cast<long double>(numerator) / denominator);
}

std::int64_t StalenessOf(const StorageView& v, StorageId s) { return v.Clock() - v.LastAccess(s); }

class Dtr final : public Policy {
 public:
  std::string_view name() const override { return "dtr"; }
  PolicyFeatures features() const override { return {.regions = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s) + v.RegionCompute(s), v.Bytes(s), StalenessOf(v, s));
  }
};

class DtrEq final : public Policy {
 public:
  std::string_view name() const override { return "dtr-eq"; }
  PolicyFeatures features() const override { return {.eq_classes = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s) + v.EqClassCompute(s), v.Bytes(s), StalenessOf(v, s));
  }
  // The default full scan (no sampling, no small-storage filter) over the engine's arrays: same scores (the same
  // long double CostDensity), ties to the later candidate, stop at exactly 0.
  bool SupportsBatch(const ChooseOptions& options) const override {
    return !options.sample_sqrt && !options.ignore_small;
  }
  std::optional<std::size_t> ChooseBatch(const CandidateBatch& b, const ChooseOptions& options,
                                         ChooseContext& context) const override {
    const std::size_t n = b.bytes.size();
    if (n == 0 || b.eq_class_compute.size() != n) return std::nullopt;
    double best = std::numeric_limits<double>::infinity();
    std::optional<std::size_t> best_index;
    std::int64_t evaluated = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (b.bytes[i] < 0) continue;  // the default path's `Bytes(s) < min_bytes` with min_bytes = 0
      const std::int64_t numerator = b.compute[i] + b.eq_class_compute[i];
      const std::int64_t staleness = b.clock - b.last_access[i];
      ++evaluated;
      // Exact skip without the long double division: with best > 0 finite and a positive numerator and
      // denominator, numerator > best * denominator * (1 + 1e-9) in doubles (each rounding <= 2^-53 relative)
      // implies the exact quotient exceeds best by more than 1e-9 relative, so its rounded score is > best: it
      // neither wins nor ties nor stops the scan. Every other case (ties, zeros, infinities, negatives) goes
      // through the same CostDensity as the default path.
      if (best > 0 && best < std::numeric_limits<double>::infinity() && numerator > 0 && b.bytes[i] > 0 &&
          staleness > 0 &&
          static_cast<double>(numerator) >
              best * (static_cast<double>(b.bytes[i]) * static_cast<double>(staleness)) * (1 + 1e-9)) {
        continue;
      }
      double cost = CostDensityInline(numerator, b.bytes[i], staleness);
      if (cost <= best) {
        best = cost;
        best_index = i;
      }
      if (cost == 0) break;
    }
    if (context.evaluations != nullptr) *context.evaluations += evaluated;
    return best_index;
  }
};

class DtrLocal final : public Policy {
 public:
  std::string_view name() const override { return "dtr-local"; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s), v.Bytes(s), StalenessOf(v, s));
  }
};

class Msps final : public Policy {
 public:
  std::string_view name() const override { return "msps"; }
  PolicyFeatures features() const override { return {.regions = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s) + v.AncestorCompute(s), v.Bytes(s), 1);
  }
};

}  // namespace

std::unique_ptr<Policy> MakeDtrPolicy() { return std::make_unique<Dtr>(); }
std::unique_ptr<Policy> MakeDtrEqPolicy() { return std::make_unique<DtrEq>(); }
std::unique_ptr<Policy> MakeDtrLocalPolicy() { return std::make_unique<DtrLocal>(); }
std::unique_ptr<Policy> MakeMspsPolicy() { return std::make_unique<Msps>(); }

}  // namespace remat
