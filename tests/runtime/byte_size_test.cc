#include "runtime/byte_size.h"

#include <gtest/gtest.h>

namespace remat {
namespace {

TEST(ParseByteSize, AcceptsUnitsOfBothFamilies) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64B"), 64u);
  EXPECT_EQ(*ParseByteSize("1KiB"), 1024u);
  EXPECT_EQ(*ParseByteSize("1kb"), 1000u);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("6GiB"), 6ull << 30);
  EXPECT_EQ(*ParseByteSize("6G"), 6ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5GB"), 1500000000u);
  EXPECT_EQ(*ParseByteSize(" 2 TiB "), 2ull << 40);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536u);
}

TEST(ParseByteSize, RejectsMalformedInputWithTheAcceptedForms) {
  for (const char* bad : {"", "GiB", "6 GiBs", "6XB", "-1", "1.2.3", "0.5B", "1e3"}) {
    absl::StatusOr<std::uint64_t> parsed = ParseByteSize(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("GiB"), std::string::npos) << parsed.status();
    EXPECT_NE(parsed.status().message().find(std::string("\"") + bad + "\""), std::string::npos) << parsed.status();
  }
}

TEST(ParseByteSize, AcceptsUpTo2To53BytesAndNamesTheLimitAbove) {
  EXPECT_EQ(*ParseByteSize("8192TiB"), kMaxQuantity);
  for (const char* big : {"9007199254740993", "9223372036854775807", "8193TiB", "99999999999TiB", "8192.5TiB"}) {
    absl::StatusOr<std::uint64_t> parsed = ParseByteSize(big);
    ASSERT_FALSE(parsed.ok()) << big;
    EXPECT_NE(parsed.status().message().find("above 8 PiB"), std::string::npos) << parsed.status();
  }
}

TEST(FormatBytes, UsesBinaryUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(6ull << 30), "6.00 GiB");
  EXPECT_EQ(FormatBytes(200ull << 20), "200 MiB");
  EXPECT_EQ(*ParseByteSize(FormatBytes(6ull << 30)), 6ull << 30);
}

}  // namespace
}  // namespace remat
