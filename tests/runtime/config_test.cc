#include "runtime/config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace remat {
namespace {

absl::StatusOr<Settings> FromMap(const std::map<std::string, std::string>& env) {
  return SettingsFromEnvironment([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Config, EmptyEnvironmentSetsNothing) {
  absl::StatusOr<Settings> settings = FromMap({});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_FALSE(settings->budget);
  EXPECT_FALSE(settings->policy);
  EXPECT_FALSE(settings->offload);
  EXPECT_FALSE(settings->host_budget);
  EXPECT_FALSE(settings->trace_path);
}

TEST(Config, ReadsEveryVariable) {
  absl::StatusOr<Settings> settings = FromMap({{"REMAT_BUDGET", "6GiB"},
                                               {"REMAT_POLICY", "dtr-eq"},
                                               {"REMAT_OFFLOAD", "auto"},
                                               {"REMAT_HOST_BUDGET", "32GiB"},
                                               {"REMAT_TRACE", "/tmp/x.log"}});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->budget->bytes, 6ull << 30);
  EXPECT_EQ(*settings->policy, "dtr-eq");
  EXPECT_EQ(*settings->offload, OffloadMode::kAuto);
  EXPECT_EQ(*settings->host_budget, 32ull << 30);
  EXPECT_EQ(*settings->trace_path, "/tmp/x.log");
}

TEST(Config, BudgetFractionResolvesAgainstDeviceMemory) {
  absl::StatusOr<Settings> settings = FromMap({{"REMAT_BUDGET", "0.5"}});
  ASSERT_TRUE(settings.ok()) << settings.status();
  ASSERT_TRUE(settings->budget->fraction);
  EXPECT_EQ(settings->budget->Resolve(16ull << 30), 8ull << 30);
  EXPECT_EQ(ParseBudget("1.0")->fraction, 1.0);
  EXPECT_EQ(ParseBudget("4096")->bytes, 4096u);  // an integer without a unit is bytes
}

TEST(Config, MalformedValuesNameTheVariable) {
  const std::map<std::string, std::string> cases[] = {
      {{"REMAT_BUDGET", "lots"}}, {{"REMAT_BUDGET", "1.5"}},     {{"REMAT_BUDGET", "0"}},
      {{"REMAT_OFFLOAD", "yes"}}, {{"REMAT_HOST_BUDGET", "1x"}},
  };
  for (const auto& env : cases) {
    absl::StatusOr<Settings> settings = FromMap(env);
    ASSERT_FALSE(settings.ok()) << env.begin()->first << "=" << env.begin()->second;
    EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(settings.status().message());
    if (env.begin()->second != "0") {
      EXPECT_NE(message.find(env.begin()->first), std::string::npos) << message;
    }
  }
}

TEST(Config, ApiSettingsWinOverTheEnvironment) {
  Settings environment = *FromMap({{"REMAT_BUDGET", "6GiB"}, {"REMAT_POLICY", "lru"}});
  Settings api;
  api.policy = "coop";
  Settings merged = MergeSettings(environment, api);
  EXPECT_EQ(*merged.policy, "coop");
  EXPECT_EQ(merged.budget->bytes, 6ull << 30);
}

TEST(Config, UnknownPolicyListsTheRegisteredOnes) {
  absl::Status status = CheckPolicy("dtr-fast", "REMAT_POLICY", {"dtr", "dtr-eq", "coop"});
  ASSERT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("REMAT_POLICY"), std::string::npos);
  EXPECT_NE(status.message().find("dtr-fast"), std::string::npos);
  EXPECT_NE(status.message().find("dtr, dtr-eq, coop"), std::string::npos);
  EXPECT_TRUE(CheckPolicy("coop", "REMAT_POLICY", {"dtr", "coop"}).ok());
}

}  // namespace
}  // namespace remat
