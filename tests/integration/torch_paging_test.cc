// Paging on CPU (issue 7): the host tier (memory and file-backed) keeps byte-identical copies within its budget, and
// the engine bridge pages storages out to it and back with real copies: values read back are bitwise the ones
// computed without remat, the arena never exceeds the budget, the host budget is never exceeded (victims that do not
// fit are dropped instead), and constants the engine cannot recompute leave the arena only with page_constants.
#include <ATen/core/Tensor.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/fill.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/narrow.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tanh.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "integration/same_bytes.h"
#include "integration/cpu_allocator.h"
#include "integration/engine_session.h"
#include "integration/host_tier.h"
#include "integration/storage_eviction.h"
#include "integration/torch_executor.h"
#include "policies/registry.h"
#include "runtime/engine.h"
#include "tests/integration/chain_workload.h"

namespace remat::integration {
namespace {

constexpr std::size_t kKiB = 1024;

std::vector<std::uint8_t> Pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 131 + (i >> 9));
  return bytes;
}

void RoundTrips(HostTierKind kind) {
  absl::StatusOr<std::unique_ptr<HostTier>> tier = HostTier::Create(HostTierOptions{kind, 1 << 20, ""});
  ASSERT_TRUE(tier.ok()) << tier.status();
  HostTier& t = **tier;
  // Sizes that are not multiples of anything, and one empty copy.
  const std::vector<std::size_t> sizes = {1, 4095, 4097, 100000, 0, 65536};
  for (std::uint32_t k = 0; k < sizes.size(); ++k) {
    const std::vector<std::uint8_t> bytes = Pattern(sizes[k], static_cast<std::uint8_t>(k));
    ASSERT_TRUE(t.Store(k, bytes.data(), bytes.size()).ok()) << k;
  }
  EXPECT_EQ(t.stats().used_bytes, static_cast<std::int64_t>(std::accumulate(sizes.begin(), sizes.end(), 0ul)));
  for (std::uint32_t k = 0; k < sizes.size(); ++k) {
    std::vector<std::uint8_t> out(sizes[k], 0xEE);
    ASSERT_TRUE(t.Load(k, out.data(), out.size()).ok()) << k;
    EXPECT_EQ(out, Pattern(sizes[k], static_cast<std::uint8_t>(k))) << k;
  }
  std::vector<std::uint8_t> wrong(10);
  EXPECT_EQ(t.Load(3, wrong.data(), wrong.size()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Store(3, wrong.data(), wrong.size()).code(), absl::StatusCode::kAlreadyExists);
  t.Release(3);
  EXPECT_FALSE(t.Holds(3));
  EXPECT_EQ(t.Load(3, wrong.data(), 100000).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.stats().used_bytes, 4097 + 1 + 4095 + 65536);
}

TEST(HostTier, MemoryCopiesComeBackByteIdentical) { RoundTrips(HostTierKind::kMemory); }

TEST(HostTier, FileCopiesComeBackByteIdentical) { RoundTrips(HostTierKind::kFile); }

TEST(HostTier, BudgetIsNeverExceededAndARefusedStoreChangesNothing) {
  for (HostTierKind kind : {HostTierKind::kMemory, HostTierKind::kFile}) {
    absl::StatusOr<std::unique_ptr<HostTier>> tier = HostTier::Create(HostTierOptions{kind, 10000, ""});
    ASSERT_TRUE(tier.ok());
    HostTier& t = **tier;
    const std::vector<std::uint8_t> a = Pattern(6000, 1), b = Pattern(4001, 2), c = Pattern(4000, 3);
    ASSERT_TRUE(t.Store(1, a.data(), a.size()).ok());
    const absl::Status refused = t.Store(2, b.data(), b.size());
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(refused.message()), testing::HasSubstr("budget 10000"));
    EXPECT_FALSE(t.Holds(2));
    EXPECT_EQ(t.stats().used_bytes, 6000);
    ASSERT_TRUE(t.Store(3, c.data(), c.size()).ok());  // exactly the budget
    EXPECT_EQ(t.stats().peak_bytes, 10000);
    t.Release(1);
    ASSERT_TRUE(t.Store(2, b.data(), b.size()).ok());
    std::vector<std::uint8_t> out(b.size());
    ASSERT_TRUE(t.Load(2, out.data(), out.size()).ok());
    EXPECT_EQ(out, b);
  }
}

TEST(HostTier, FileSpaceIsReusedAfterRelease) {
  absl::StatusOr<std::unique_ptr<HostTier>> tier = HostTier::Create(HostTierOptions{HostTierKind::kFile});
  ASSERT_TRUE(tier.ok());
  HostTier& t = **tier;
  const std::vector<std::uint8_t> big = Pattern(64 * kKiB, 9);
  for (std::uint32_t k = 0; k < 4; ++k) ASSERT_TRUE(t.Store(k, big.data(), big.size()).ok());
  const std::int64_t size = t.stats().file_bytes;
  EXPECT_EQ(size, 4 * 64 * static_cast<std::int64_t>(kKiB));
  t.Release(1);
  t.Release(2);  // coalesced with 1: room for one copy twice as big
  const std::vector<std::uint8_t> double_size = Pattern(128 * kKiB, 4);
  ASSERT_TRUE(t.Store(7, double_size.data(), double_size.size()).ok());
  EXPECT_EQ(t.stats().file_bytes, size);
  std::vector<std::uint8_t> out(double_size.size());
  ASSERT_TRUE(t.Load(7, out.data(), out.size()).ok());
  EXPECT_EQ(out, double_size);
  ASSERT_TRUE(t.Load(3, out.data(), big.size()).ok());  // its neighbour was not overwritten
  EXPECT_TRUE(std::equal(big.begin(), big.end(), out.begin()));
}

TEST(HostTier, AMissingDirectoryIsAClearError) {
  absl::StatusOr<std::unique_ptr<HostTier>> tier =
      HostTier::Create(HostTierOptions{HostTierKind::kFile, 1 << 20, "/nonexistent/remat-dir"});
  ASSERT_FALSE(tier.ok());
  EXPECT_THAT(std::string(tier.status().message()), testing::HasSubstr("/nonexistent/remat-dir"));
  EXPECT_EQ(ParseHostTierKind("flash").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParseHostTierKind("flash").status().message()), testing::HasSubstr("memory or file"));
  EXPECT_EQ(*ParseHostTierKind(" File "), HostTierKind::kFile);
}

EngineSessionOptions Paging(std::size_t budget, OffloadMode mode, HostTierKind kind = HostTierKind::kMemory) {
  EngineSessionOptions options{budget, "dtr-eq", "estimated"};
  options.offload = mode;
  options.host_tier = kind;
  return options;
}

void ChainIsIdenticalWithPaging(HostTierKind kind) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB
  at::manual_seed(7);
  const std::vector<at::Tensor> reference = Chain(x, 24);
  {
    EngineGuard guard(Paging(640 * kKiB, OffloadMode::kAlways, kind));
    at::manual_seed(7);
    std::vector<at::Tensor> ys = Chain(x, 24);
    for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
    absl::StatusOr<BridgeStats> stats = GetEngineStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->engine.page_outs, 0);
    EXPECT_GT(stats->engine.page_ins, 0);
    EXPECT_EQ(stats->executor.page_outs, stats->engine.page_outs);
    EXPECT_EQ(stats->executor.page_ins, stats->engine.page_ins);
    EXPECT_GT(stats->engine.paged_in_bytes, 0);
    EXPECT_EQ(stats->host_tier.used_bytes, stats->engine.host_used_bytes);
    if (kind == HostTierKind::kFile) {
      EXPECT_GT(stats->host_tier.file_bytes, 0);
    }
    absl::StatusOr<CpuArenaStats> arena = GetCpuArenaStats();
    ASSERT_TRUE(arena.ok());
    EXPECT_LE(arena->peak_allocated_bytes, 640 * kKiB);
  }
  EXPECT_FALSE(RematEngineEnabled());
}

TEST(TorchPaging, PagedStoragesComeBackByteIdentical) { ChainIsIdenticalWithPaging(HostTierKind::kMemory); }

TEST(TorchPaging, FileBackedTierRoundTrip) { ChainIsIdenticalWithPaging(HostTierKind::kFile); }

TEST(TorchPaging, PagedTensorsStayReadableAfterDisable) {
  const at::Tensor x = at::randn({64, 64});
  at::manual_seed(5);
  const std::vector<at::Tensor> reference = Chain(x, 12);
  std::vector<at::Tensor> ys;
  std::int64_t host_used = 0;
  {
    EngineGuard guard(Paging(160 * kKiB, OffloadMode::kAlways));
    at::manual_seed(5);
    ys = Chain(x, 12);
    host_used = GetEngineStats()->engine.host_used_bytes;
  }
  EXPECT_GT(host_used, 0);  // some were on the tier when remat was switched off
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
}

TEST(TorchPaging, HostBudgetIsRespectedAndVictimsThatDoNotFitAreDropped) {
  const at::Tensor x = at::randn({128, 128});
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Chain(x, 24);
  EngineSessionOptions options = Paging(640 * kKiB, OffloadMode::kAlways);
  options.host_budget = 3 * 64 * kKiB + 100;  // three of the chain's 64 KiB storages
  EngineGuard guard(options);
  at::manual_seed(11);
  std::vector<at::Tensor> ys = Chain(x, 24);
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.page_outs, 0);
  EXPECT_GT(stats->engine.evictions, stats->engine.page_outs);  // the rest were dropped, not refused
  EXPECT_LE(stats->engine.host_peak_bytes, static_cast<std::int64_t>(options.host_budget));
  EXPECT_LE(stats->host_tier.peak_bytes, static_cast<std::int64_t>(options.host_budget));
  EXPECT_EQ(stats->host_tier.peak_bytes, 3 * 64 * static_cast<std::int64_t>(kKiB));
}

// Constants in the arena: tensors made by aten::empty and written in two halves (no write covers the storage, so
// they stay constants remat cannot recompute).
std::vector<at::Tensor> Constants(int n) {
  std::vector<at::Tensor> out;
  for (int i = 0; i < n; ++i) {
    at::Tensor c = at::empty({128, 128});
    c.narrow(0, 0, 64).fill_(i + 0.25);
    c.narrow(0, 64, 64).fill_(-i - 0.5);
    out.push_back(c);
  }
  return out;
}

TEST(TorchPaging, ConstantsArePagedOnlyWithPageConstants) {
  const std::vector<at::Tensor> reference = Constants(12);  // 12 x 64 KiB
  {
    EngineSessionOptions options = Paging(400 * kKiB, OffloadMode::kAlways);
    options.page_constants = false;
    EngineGuard guard(options);
    EXPECT_THROW((void)Constants(12), c10::OutOfMemoryError);
  }
  EngineGuard guard(Paging(400 * kKiB, OffloadMode::kAlways));
  std::vector<at::Tensor> got = Constants(12);
  absl::StatusOr<BridgeStats> paged_out = GetEngineStats();
  ASSERT_TRUE(paged_out.ok());
  EXPECT_GE(paged_out->engine.page_outs, 6);
  EXPECT_EQ(paged_out->engine.evictions, 0);  // nothing could be dropped
  // Reading each one pages it in (and others out), bitwise the value written.
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(SameBytes(got[i], reference[i])) << i;
    got[i].mul_(2.0);  // a write to a constant that may be paged
  }
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBytes(got[i], at::mul(reference[i], 2.0))) << i;
  EXPECT_GT(GetEngineStats()->engine.page_ins, 0);
  absl::StatusOr<CpuArenaStats> arena = GetCpuArenaStats();
  ASSERT_TRUE(arena.ok());
  EXPECT_LE(arena->peak_allocated_bytes, 400 * kKiB);
}

// The executor's error contract (runtime/executor.h): without a tier paging is Unimplemented, and a copy the tier
// refuses leaves the storage resident with its bytes; an accepted one comes back into the same StorageImpl,
// byte-identical. An engine over a TorchExecutor with no arena (torch's own allocator) and a tensor adopted as a
// constant.
TEST(TorchExecutorPaging, ARefusedCopyLosesNothingAndAPageInComesBackByteIdentical) {
  absl::StatusOr<std::unique_ptr<Policy>> policy = MakePolicy("lru");
  ASSERT_TRUE(policy.ok());
  EngineOptions options;
  options.policy = policy->get();
  options.paging.mode = OffloadMode::kAlways;
  options.paging.page_constants = true;
  TorchExecutor executor;
  Engine engine(options, &executor);
  const at::Tensor x = at::randn({64});  // 256 bytes
  const at::Tensor original = x.clone();
  const TensorId t = engine.AdoptConstant(256, 0);
  const StorageIndex s = engine.StorageOf(t);
  executor.SetHome(s, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(x.storage().unsafeGetStorageImpl()));

  EXPECT_EQ(engine.PageOut(s).code(), absl::StatusCode::kUnimplemented);  // no tier: loudly, nothing lost
  absl::StatusOr<std::unique_ptr<HostTier>> small = HostTier::Create(HostTierOptions{HostTierKind::kMemory, 100});
  ASSERT_TRUE(small.ok());
  executor.SetHostTier(small->get());
  const absl::Status refused = engine.PageOut(s);  // the engine's host budget is unlimited, the tier's is not
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(engine.Resident(s));
  EXPECT_FALSE(engine.Paged(s));
  EXPECT_FALSE(IsEvicted(*x.storage().unsafeGetStorageImpl()));
  EXPECT_TRUE(SameBytes(x, original));
  EXPECT_EQ((*small)->stats().used_bytes, 0);

  absl::StatusOr<std::unique_ptr<HostTier>> tier = HostTier::Create(HostTierOptions{HostTierKind::kFile, 1 << 20});
  ASSERT_TRUE(tier.ok());
  executor.SetHostTier(tier->get());
  ASSERT_TRUE(engine.PageOut(s).ok());
  EXPECT_TRUE(engine.Paged(s));
  EXPECT_TRUE(IsEvicted(*x.storage().unsafeGetStorageImpl()));
  EXPECT_EQ((*tier)->stats().used_bytes, 256);
  EXPECT_FALSE(engine.Defined(t));
  ASSERT_TRUE(engine.Rematerialize(t).ok());  // pages it in
  EXPECT_FALSE(engine.Paged(s));
  EXPECT_TRUE(engine.Resident(s));
  EXPECT_TRUE(SameBytes(x, original));  // the same StorageImpl, byte-identical
  EXPECT_EQ((*tier)->stats().used_bytes, 0);
  EXPECT_EQ(executor.stats().page_outs, 1);
  EXPECT_EQ(executor.stats().page_ins, 1);
  executor.Clear();
}

TEST(TorchPaging, OptionsAndEnvironmentAreParsedByTheConfigParser) {
  absl::StatusOr<PagingSetting> given = ResolvePaging(std::string("Always"), std::string("64MiB"));
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->offload, OffloadMode::kAlways);
  EXPECT_EQ(given->host_budget, 64 << 20);
  const absl::Status bad = ResolvePaging(std::string("sometimes"), std::nullopt).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), testing::HasSubstr("offload"));
  EXPECT_THAT(std::string(bad.message()), testing::HasSubstr("expected off, auto or always"));
  EXPECT_THAT(std::string(ResolvePaging(std::nullopt, std::string("lots")).status().message()),
              testing::HasSubstr("host_budget"));
  ASSERT_EQ(setenv("REMAT_OFFLOAD", "auto", 1), 0);
  ASSERT_EQ(setenv("REMAT_HOST_BUDGET", "1GiB", 1), 0);
  absl::StatusOr<PagingSetting> from_env = ResolvePaging(std::nullopt, std::nullopt);
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->offload, OffloadMode::kAuto);
  EXPECT_EQ(from_env->host_budget, std::int64_t{1} << 30);
  EXPECT_EQ(ResolvePaging(std::string("off"), std::nullopt)->offload, OffloadMode::kOff);  // the option wins
  ASSERT_EQ(setenv("REMAT_HOST_BUDGET", "12 parsecs", 1), 0);
  EXPECT_THAT(std::string(ResolvePaging(std::nullopt, std::nullopt).status().message()),
              testing::HasSubstr("REMAT_HOST_BUDGET"));
  unsetenv("REMAT_OFFLOAD");
  unsetenv("REMAT_HOST_BUDGET");
  EXPECT_EQ(ResolvePaging(std::nullopt, std::nullopt)->offload, OffloadMode::kOff);
}

}  // namespace
}  // namespace remat::integration
