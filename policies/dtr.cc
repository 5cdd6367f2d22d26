#include "policies/dtr.h"

#include <limits>

namespace remat {
namespace {

// W(s) for the dense scan (Policy::HasStalenessWeight): numerator / bytes, so that W / staleness is the score
// within a few double roundings (each <= 2^-53 relative), far inside the 1e-12 the contract allows. Zero bytes
// score infinity at any staleness.
inline double WeightPerByte(std::int64_t numerator, std::int64_t bytes) {
  if (bytes <= 0) return std::numeric_limits<double>::infinity();
  return static_cast<double>(numerator) / static_cast<double>(bytes);
}

std::int64_t StalenessOf(const StorageView& v, StorageId s) { return v.Staleness(s); }

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
  bool HasStalenessWeight() const override { return true; }
  double StalenessWeight(const StorageView& v, StorageId s) const override {
    return WeightPerByte(v.Compute(s) + v.EqClassCompute(s), v.Bytes(s));
  }
};

class DtrLocal final : public Policy {
 public:
  std::string_view name() const override { return "dtr-local"; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s), v.Bytes(s), StalenessOf(v, s));
  }
  bool HasStalenessWeight() const override { return true; }
  double StalenessWeight(const StorageView& v, StorageId s) const override {
    return WeightPerByte(v.Compute(s), v.Bytes(s));
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
