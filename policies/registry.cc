#include "policies/registry.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "policies/dtr.h"
#include "policies/simple.h"
#include "policies/window.h"

namespace remat {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, PolicyFactory, std::less<>> factories;
  Registry() {
    factories.emplace("dtr", MakeDtrPolicy);
    factories.emplace("dtr-eq", MakeDtrEqPolicy);
    factories.emplace("dtr-local", MakeDtrLocalPolicy);
    factories.emplace("msps", MakeMspsPolicy);
    factories.emplace("lru", MakeLruPolicy);
    factories.emplace("largest", MakeLargestPolicy);
    factories.emplace("random", MakeRandomPolicy);
    factories.emplace("dte", MakeDtePolicy);
    factories.emplace("coop", MakeCoopPolicy);
    // Plan mode (runtime/plan_mode.h): the drivers (remat-sim, the PyTorch bridge) follow a plan made from a recorded
    // iteration; until a plan is ready, and wherever the op stream departs from it, the engine chooses as dtr-eq.
    factories.emplace(std::string(kPlanPolicy), MakeDtrEqPolicy);
  }
};

Registry& Get() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.factories.find(name);
  if (it == r.factories.end()) {
    std::vector<std::string> names;
    for (const auto& [n, f] : r.factories) names.push_back(n);
    return absl::InvalidArgumentError(absl::StrCat("unknown policy '", std::string(name),
                                                   "' (known: ", absl::StrJoin(names, ", "), ")"));
  }
  return it->second();
}

absl::Status RegisterPolicy(std::string_view name, PolicyFactory factory) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.factories.emplace(std::string(name), std::move(factory)).second) {
    return absl::AlreadyExistsError(absl::StrCat("policy '", std::string(name), "' is already registered"));
  }
  return absl::OkStatus();
}

std::vector<std::string> PolicyNames() {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

}  // namespace remat
