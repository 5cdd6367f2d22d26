#include "policies/simple.h"

#include <limits>

namespace remat {
namespace {

class Lru final : public Policy {
 public:
  std::string_view name() const override { return "lru"; }
  double Score(const StorageView& v, StorageId s) const override { return static_cast<double>(v.LastAccess(s)); }
};

class Largest final : public Policy {
 public:
  std::string_view name() const override { return "largest"; }
  double Score(const StorageView& v, StorageId s) const override {
    std::int64_t m = v.Bytes(s);
    return m > 0 ? 1.0 / static_cast<double>(m) : std::numeric_limits<double>::infinity();
  }
};

class Random final : public Policy {
 public:
  std::string_view name() const override { return "random"; }
  double Score(const StorageView&, StorageId) const override { return 0; }
  std::optional<std::size_t> Choose(const StorageView&, std::span<const StorageId> candidates, const ChooseOptions&,
                                    ChooseContext& context) const override {
    if (candidates.empty()) return std::nullopt;
    if (context.evaluations != nullptr) ++*context.evaluations;
    if (context.rng == nullptr) return candidates.size() - 1;
    return std::uniform_int_distribution<std::size_t>(0, candidates.size() - 1)(*context.rng);
  }
};

}  // namespace

std::unique_ptr<Policy> MakeLruPolicy() { return std::make_unique<Lru>(); }
std::unique_ptr<Policy> MakeLargestPolicy() { return std::make_unique<Largest>(); }
std::unique_ptr<Policy> MakeRandomPolicy() { return std::make_unique<Random>(); }

}  // namespace remat
