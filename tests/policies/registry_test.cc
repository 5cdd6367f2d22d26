#include "policies/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

TEST(RegistryTest, BuiltinsArePresent) {
  std::vector<std::string> names = PolicyNames();
  for (const char* n : {"dtr", "dtr-eq", "dtr-local", "msps", "lru", "largest", "random", "dte", "coop"}) {
    EXPECT_THAT(names, ::testing::Contains(n));
    absl::StatusOr<std::unique_ptr<Policy>> p = MakePolicy(n);
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_EQ((*p)->name(), n);
  }
}

TEST(RegistryTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<std::unique_ptr<Policy>> p = MakePolicy("nope");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("unknown policy 'nope'"));
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("dtr-eq"));
}

class Smallest final : public Policy {
 public:
  std::string_view name() const override { return "smallest"; }
  double Score(const StorageView& v, StorageId s) const override { return static_cast<double>(v.Bytes(s)); }
};

TEST(RegistryTest, UserCodeCanRegisterPolicies) {
  ASSERT_TRUE(RegisterPolicy("smallest", [] { return std::make_unique<Smallest>(); }).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(RegisterPolicy("smallest", [] { return std::make_unique<Smallest>(); })));
  absl::StatusOr<std::unique_ptr<Policy>> p = MakePolicy("smallest");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "smallest");
}

}  // namespace
}  // namespace remat
