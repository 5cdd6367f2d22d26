// The user's remat settings and their environment variables (DESIGN.md, "Configuration").
//
//   REMAT_BUDGET       device memory budget: bytes with a unit ("6GiB", "512MiB", "4096") or a fraction of
//                      device memory written with a decimal point ("0.5", "1.0"; must be in (0, 1])
//   REMAT_POLICY       eviction policy: a registered name (checked by CheckPolicy against the registry)
//   REMAT_OFFLOAD      off | auto | always
//   REMAT_HOST_BUDGET  second-tier (host) budget for paging: bytes with a unit
//   REMAT_TRACE        record the executed op stream as a trace to this path
//
// Each variable is read once and parsed strictly: a malformed value is InvalidArgument naming the variable, the
// value and the accepted forms. An empty variable counts as unset. The Python and C++ APIs build the same
// Settings and win over the environment (MergeSettings).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat {

// A budget is either absolute or relative to the device's memory (resolved by whoever knows the device).
struct BudgetSetting {
  std::optional<std::uint64_t> bytes;
  std::optional<double> fraction;

  // Bytes for a device with `device_bytes` of memory.
  std::uint64_t Resolve(std::uint64_t device_bytes) const;
  std::string ToString() const;
};

enum class OffloadMode { kOff, kAuto, kAlways };

struct Settings {
  std::optional<BudgetSetting> budget;
  std::optional<std::string> policy;
  std::optional<OffloadMode> offload;
  std::optional<std::uint64_t> host_budget;
  std::optional<std::string> trace_path;
};

absl::StatusOr<BudgetSetting> ParseBudget(std::string_view text);
absl::StatusOr<OffloadMode> ParseOffloadMode(std::string_view text);
std::string_view OffloadModeName(OffloadMode mode);

// Reads the REMAT_* variables through `getenv` (std::getenv by default; tests pass their own).
using EnvironmentLookup = absl::FunctionRef<const char*(const char*)>;
absl::StatusOr<Settings> SettingsFromEnvironment();
absl::StatusOr<Settings> SettingsFromEnvironment(EnvironmentLookup getenv);

// Fields set in `api` replace those from `environment`.
Settings MergeSettings(const Settings& environment, const Settings& api);

// NotFound naming the policy, where it came from (`source`, e.g. "REMAT_POLICY") and the registered names.
absl::Status CheckPolicy(std::string_view policy, std::string_view source,
                         const std::vector<std::string>& registered);

}  // namespace remat
