#include "runtime/config.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/byte_size.h"

namespace remat {

std::uint64_t BudgetSetting::Resolve(std::uint64_t device_bytes) const {
  if (bytes) return *bytes;
  return static_cast<std::uint64_t>(static_cast<double>(device_bytes) * fraction.value_or(1.0));
}

std::string BudgetSetting::ToString() const {
  if (bytes) return FormatBytes(*bytes);
  return absl::StrFormat("%g of device memory", fraction.value_or(1.0));
}

absl::StatusOr<BudgetSetting> ParseBudget(std::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  BudgetSetting budget;
  double fraction = 0;
  // A bare number with a decimal point is a fraction; with a unit or as an integer it is bytes.
  if (trimmed.find('.') != absl::string_view::npos && absl::SimpleAtod(trimmed, &fraction) &&
      trimmed.find_first_not_of("0123456789.") == absl::string_view::npos) {
    if (!(fraction > 0 && fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "budget fraction \"%s\" is outside (0, 1]; write a fraction of device memory such as 0.5, "
          "or bytes with a unit such as 6GiB",
          text));
    }
    budget.fraction = fraction;
    return budget;
  }
  absl::StatusOr<std::uint64_t> bytes = ParseByteSize(std::string_view(trimmed.data(), trimmed.size()));
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s; or a fraction of device memory with a decimal point such as 0.5", bytes.status().message()));
  }
  if (*bytes == 0) return absl::InvalidArgumentError("a budget of 0 bytes leaves no memory to run anything");
  budget.bytes = *bytes;
  return budget;
}

absl::StatusOr<OffloadMode> ParseOffloadMode(std::string_view text) {
  const std::string mode = absl::AsciiStrToLower(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  if (mode == "off") return OffloadMode::kOff;
  if (mode == "auto") return OffloadMode::kAuto;
  if (mode == "always") return OffloadMode::kAlways;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown offload mode \"%s\"; expected off, auto or always", text));
}

std::string_view OffloadModeName(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::kOff: return "off";
    case OffloadMode::kAuto: return "auto";
    case OffloadMode::kAlways: return "always";
  }
  return "off";
}

namespace {

// Wraps a parse error so that it names the variable it came from.
absl::Status InVariable(const char* name, std::string_view value, const absl::Status& status) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s=\"%s\" is not valid: %s", name, value, status.message()));
}

}  // namespace

absl::StatusOr<Settings> SettingsFromEnvironment() {
  return SettingsFromEnvironment([](const char* name) -> const char* { return std::getenv(name); });
}

absl::StatusOr<Settings> SettingsFromEnvironment(EnvironmentLookup getenv) {
  Settings settings;
  auto value_of = [&](const char* name) -> std::optional<std::string_view> {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string_view(value);
  };
  if (auto value = value_of("REMAT_BUDGET")) {
    absl::StatusOr<BudgetSetting> budget = ParseBudget(*value);
    if (!budget.ok()) return InVariable("REMAT_BUDGET", *value, budget.status());
    settings.budget = *budget;
  }
  if (auto value = value_of("REMAT_POLICY")) {
    settings.policy = std::string(absl::StripAsciiWhitespace(absl::string_view(value->data(), value->size())));
  }
  if (auto value = value_of("REMAT_OFFLOAD")) {
    absl::StatusOr<OffloadMode> mode = ParseOffloadMode(*value);
    if (!mode.ok()) return InVariable("REMAT_OFFLOAD", *value, mode.status());
    settings.offload = *mode;
  }
  if (auto value = value_of("REMAT_HOST_BUDGET")) {
    absl::StatusOr<std::uint64_t> bytes = ParseByteSize(*value);
    if (!bytes.ok()) return InVariable("REMAT_HOST_BUDGET", *value, bytes.status());
    settings.host_budget = *bytes;
  }
  if (auto value = value_of("REMAT_TRACE")) settings.trace_path = std::string(*value);
  return settings;
}

Settings MergeSettings(const Settings& environment, const Settings& api) {
  Settings merged = environment;
  if (api.budget) merged.budget = api.budget;
  if (api.policy) merged.policy = api.policy;
  if (api.offload) merged.offload = api.offload;
  if (api.host_budget) merged.host_budget = api.host_budget;
  if (api.trace_path) merged.trace_path = api.trace_path;
  return merged;
}

absl::Status CheckPolicy(std::string_view policy, std::string_view source,
                         const std::vector<std::string>& registered) {
  for (const std::string& name : registered) {
    if (name == policy) return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrFormat("%s: unknown eviction policy \"%s\"; registered policies: %s", source,
                                             policy, absl::StrJoin(registered, ", ")));
}

}  // namespace remat
