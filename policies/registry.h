// Registry: policies by name. The built-ins (dtr, dtr-eq, dtr-local, msps, lru, largest, random, dte, coop, and
// plan: dtr-eq's choices for the engine, plan mode for the drivers, runtime/plan_mode.h) are always present; user code may add its own with RegisterPolicy before creating engines.
//
// Contract: names are case-sensitive; MakePolicy of an unknown name is InvalidArgument listing the known names;
// registering an existing name is AlreadyExists. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policies/policy.h"

namespace remat {

// The name that asks the drivers for plan mode (runtime/plan_mode.h).
inline constexpr std::string_view kPlanPolicy = "plan";

using PolicyFactory = std::function<std::unique_ptr<Policy>()>;

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name);
absl::Status RegisterPolicy(std::string_view name, PolicyFactory factory);
// Registered names, sorted.
std::vector<std::string> PolicyNames();

}  // namespace remat
