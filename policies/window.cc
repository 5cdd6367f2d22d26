#include "policies/window.h"

#include <limits>

namespace remat {
namespace {

class Dte final : public Policy {
 public:
  std::string_view name() const override { return "dte"; }
  PolicyFeatures features() const override { return {.eq_classes = true, .addresses = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s) + v.EqClassCompute(s), v.Bytes(s) + v.AdjacentFreeBytes(s),
                       v.Clock() - v.LastAccess(s));
  }
};

class Coop final : public Policy {
 public:
  std::string_view name() const override { return "coop"; }
  PolicyFeatures features() const override { return {.addresses = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    std::int64_t staleness = v.Clock() - v.LastAccess(s);
    if (staleness <= 0) return std::numeric_limits<double>::infinity();
    return static_cast<double>(v.Compute(s) + v.EvictedNeighbourCompute(s)) / static_cast<double>(staleness);
  }
  // The same numerator as Score, so W / staleness (double) is Score bit for bit.
  bool HasStalenessWeight() const override { return true; }
  double StalenessWeight(const StorageView& v, StorageId s) const override {
    return static_cast<double>(v.Compute(s) + v.EvictedNeighbourCompute(s));
  }
  bool UsesWindows() const override { return true; }
  std::optional<double> WindowCost(const StorageView& v, StorageId s) const override {
    if (!v.Evictable(s)) return std::nullopt;
    double cost = Score(v, s);
    // A just-produced storage (staleness 0) is as good as pinned for this op: make it a barrier.
    if (cost == std::numeric_limits<double>::infinity()) return std::nullopt;
    return cost;
  }
};

}  // namespace

std::unique_ptr<Policy> MakeDtePolicy() { return std::make_unique<Dte>(); }
std::unique_ptr<Policy> MakeCoopPolicy() { return std::make_unique<Coop>(); }

}  // namespace remat
