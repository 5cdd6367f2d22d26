#include "runtime/byte_size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace remat {
namespace {

constexpr std::string_view kAcceptedForms =
    "a number of bytes with an optional unit: B, KB, MB, GB, TB (powers of 1000), "
    "KiB, MiB, GiB, TiB or K, M, G, T (powers of 1024), e.g. 6GiB, 512MiB, 1.5GB, 4096";

absl::Status Malformed(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("malformed byte size \"%s\" (%s); expected %s", text, why, kAcceptedForms));
}

// Returns 0 for an unknown unit.
double UnitMultiplier(std::string unit) {
  unit = absl::AsciiStrToLower(unit);
  if (unit.empty() || unit == "b") return 1;
  constexpr std::string_view kPrefixes = "kmgt";
  if (unit.size() > 3 || kPrefixes.find(unit[0]) == absl::string_view::npos) return 0;
  const int power = static_cast<int>(kPrefixes.find(unit[0])) + 1;
  const std::string_view rest = std::string_view(unit).substr(1);
  if (rest.empty() || rest == "ib") return std::pow(1024.0, power);
  if (rest == "b") return std::pow(1000.0, power);
  return 0;
}

}  // namespace

absl::StatusOr<std::uint64_t> ParseByteSize(std::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  std::size_t number_end = 0;
  bool seen_digit = false, seen_point = false;
  while (number_end < trimmed.size()) {
    const char c = trimmed[number_end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
    ++number_end;
  }
  if (!seen_digit) return Malformed(text, "no number");
  const std::string number(trimmed.substr(0, number_end));
  const std::string unit(absl::StripAsciiWhitespace(trimmed.substr(number_end)));
  const double multiplier = UnitMultiplier(unit);
  if (multiplier == 0) return Malformed(text, absl::StrFormat("unknown unit \"%s\"", unit));
  const absl::Status too_large = absl::InvalidArgumentError(absl::StrFormat(
      "byte size \"%s\" is too large: above 8 PiB (2^53 bytes), the largest size remat accepts", text));
  if (!seen_point) {  // a whole count: exact in integers (a double would round counts above 2^53 into range)
    std::uint64_t count = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), count);
    const auto scale = static_cast<std::uint64_t>(multiplier);
    if (error != std::errc() || count > kMaxQuantity / scale) return too_large;
    return count * scale;
  }
  const double bytes = std::strtod(number.c_str(), nullptr) * multiplier;
  if (bytes > static_cast<double>(kMaxQuantity)) return too_large;
  if (bytes != std::floor(bytes)) return Malformed(text, "not a whole number of bytes");
  return static_cast<std::uint64_t>(bytes);
}

std::string FormatBytes(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  if (value >= 100) return absl::StrFormat("%.0f %s", value, kUnits[unit]);
  if (value >= 10) return absl::StrFormat("%.1f %s", value, kUnits[unit]);
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

}  // namespace remat
