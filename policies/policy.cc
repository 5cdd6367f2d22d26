#include "policies/policy.h"

#include <cmath>
#include <limits>
#include <vector>

namespace remat {

double CostDensity(std::int64_t numerator, std::int64_t bytes, std::int64_t staleness) {
  long double denominator = static_cast<long double>(bytes) * static_cast<long double>(staleness);
  if (!(denominator > 0)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(static_cast<long double>(numerator) / denominator);
}

std::optional<std::size_t> Policy::Choose(const StorageView& view, std::span<const StorageId> candidates,
                                          const ChooseOptions& options, ChooseContext& context) const {
  if (candidates.empty()) return std::nullopt;
  std::int64_t min_bytes = 0;
  if (options.ignore_small) {
    long double total = 0;
    for (StorageId s : candidates) total += view.Bytes(s);
    long double mean = total / candidates.size();
    min_bytes = static_cast<std::int64_t>(mean / 100);
    bool any = false;
    for (StorageId s : candidates) any = any || view.Bytes(s) >= min_bytes;
    if (!any) min_bytes = 0;
  }
  double best = std::numeric_limits<double>::infinity();
  std::optional<std::size_t> best_index;
  std::int64_t evaluated = 0;
  auto consider = [&](std::size_t i) -> bool {
    StorageId s = candidates[i];
    if (view.Bytes(s) < min_bytes) return false;
    double cost = Score(view, s);
    ++evaluated;
    if (cost <= best) {  // ties go to the later candidate; infinity still beats "none yet"
      best = cost;
      best_index = i;
    }
    return cost == 0;
  };
  if (options.sample_sqrt && candidates.size() > 1 && context.rng != nullptr) {
    std::size_t k = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(candidates.size()))));
    std::uniform_int_distribution<std::size_t> pick(0, candidates.size() - 1);
    for (std::size_t j = 0; j < k; ++j) {
      if (consider(pick(*context.rng))) break;
    }
    if (!best_index) {
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        if (consider(i)) break;
      }
    }
  } else {
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (consider(i)) break;
    }
  }
  if (context.evaluations != nullptr) *context.evaluations += evaluated;
  return best_index;
}

}  // namespace remat
