// Byte sizes as users write them: "6GiB", "512MiB", "1.5GB", "4096", "64KiB".
//
// ParseByteSize accepts a non-negative decimal number followed by an optional unit, with optional spaces between:
// B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), also K/M/G/T (powers of 1024, as in
// PyTorch's and the shell's usage). Units are case-insensitive. A fractional count must come out as a whole
// number of bytes after scaling ("1.5KiB" is 1536; "0.5B" is an error). Anything else is InvalidArgument with a
// message that quotes the input and lists the accepted forms.
//
// FormatBytes renders with binary units and three significant digits ("1.50 GiB", "512 B").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace remat {

// The largest count of bytes, and in traces of nanoseconds, remat accepts: 2^53 (8 PiB; 104 days). Anything larger
// is an error where it is read (ParseByteSize, the trace reader), never a silent substitution: below it, sums of a
// trace's values stay far from int64's range and convert to double exactly, so peaks, clocks and ratios neither
// wrap nor round.
inline constexpr std::uint64_t kMaxQuantity = std::uint64_t{1} << 53;

// InvalidArgument above kMaxQuantity too.
absl::StatusOr<std::uint64_t> ParseByteSize(std::string_view text);
std::string FormatBytes(std::uint64_t bytes);

}  // namespace remat
