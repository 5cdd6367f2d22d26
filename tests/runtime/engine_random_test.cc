// Randomized: random op graphs where every op computes a hash of its inputs. Run unconstrained, then under random
// budgets with every policy in both accounting modes: every op sees resident inputs, the budget is never exceeded,
// and every value (first computed or replayed) equals the unconstrained run's. With paging (offload auto and always,
// constants pageable or not, prefetch or not) the same holds, paged values come back byte-identical and the host
// budget is never exceeded.
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "allocator/arena.h"
#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/engine.h"
#include "tests/runtime/value_hash.h"

namespace remat {
namespace {

class HashExecutor : public Executor {
 public:
  HashExecutor(Arena* arena, std::int64_t budget, std::vector<std::uint64_t>* golden)
      : arena_(arena), budget_(budget), golden_(golden) {}

  absl::Status Execute(Engine& e, OpId op, bool replay, std::span<const std::uint32_t> fresh) override {
    std::uint64_t h = Mix(0x1234, op);
    for (TensorId in : e.OpInputs(op)) {
      StorageIndex s = e.StorageOf(in);
      if (!e.Resident(s) || s >= value_.size() || !value_[s]) {
        ++failures;
        ADD_FAILURE() << "op " << op << " sees a non-resident input (storage " << s << ")";
        return absl::InternalError("input not resident");
      }
      h = Mix(h, *value_[s]);
    }
    if (arena_ != nullptr) {
      for (std::uint32_t s : fresh) {
        e.NoteAllocation();
        absl::StatusOr<std::uintptr_t> a = arena_->Allocate(e.StorageBytes(s), OwnerId{s} + 1);
        if (!a.ok()) return absl::ResourceExhaustedError(a.status().message());
        e.SetAddress(s, *a);
      }
      if (arena_->Stats().allocated_bytes > arena_->Stats().reserved_bytes) {
        ++failures;
        ADD_FAILURE() << "arena over its capacity";
      }
    } else if (e.stats().used_bytes > budget_) {
      ++failures;
      ADD_FAILURE() << "budget exceeded: " << e.stats().used_bytes << " > " << budget_;
    }
    std::span<const TensorId> outs = e.OpOutputs(op);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      StorageIndex s = e.StorageOf(outs[i]);
      if (value_.size() <= s) value_.resize(s + 1);
      if (e.ProducerOf(e.StorageRoot(s)) != op) continue;  // a view: the storage's value is its base's
      std::uint64_t v = Mix(h, i);
      value_[s] = v;
      if (golden_->size() <= outs[i]) golden_->resize(outs[i] + 1, 0);
      std::uint64_t& g = (*golden_)[outs[i]];
      if (g == 0) {
        g = v;
      } else if (g != v) {
        ++failures;
        ADD_FAILURE() << "op " << op << (replay ? " (replay)" : "") << " output " << i << " differs from the "
                      << "unconstrained run";
      }
    }
    return absl::OkStatus();
  }
  void Evict(Engine& e, std::uint32_t s) override {
    value_[s].reset();
    if (arena_ != nullptr) (void)arena_->Free(e.StorageAddress(s));
  }
  absl::Status PageOut(Engine& e, std::uint32_t s) override {
    if (!e.Resident(s) || !value_[s]) {
      ++failures;
      ADD_FAILURE() << "paging out storage " << s << " that holds no value";
    }
    if (host_.size() <= s) host_.resize(s + 1);
    host_[s] = value_[s];
    host_bytes_ += e.StorageBytes(s);
    if (host_bytes_ > host_budget) {
      ++failures;
      ADD_FAILURE() << "host budget exceeded: " << host_bytes_ << " > " << host_budget;
    }
    Evict(e, s);
    return absl::OkStatus();
  }
  absl::Status PageIn(Engine& e, std::uint32_t s) override {
    if (s >= host_.size() || !host_[s]) {
      ++failures;
      ADD_FAILURE() << "paging in storage " << s << " that has no host copy";
      return absl::InternalError("no host copy");
    }
    if (arena_ != nullptr) {
      e.NoteAllocation();
      absl::StatusOr<std::uintptr_t> a = arena_->Allocate(e.StorageBytes(s), OwnerId{s} + 1);
      if (!a.ok()) return absl::ResourceExhaustedError(a.status().message());
      e.SetAddress(s, *a);
    }
    value_[s] = host_[s];  // byte-identical by construction; the hashes of later ops check it
    DropPaged(e, s);
    return absl::OkStatus();
  }
  void DropPaged(Engine& e, std::uint32_t s) override {
    host_[s].reset();
    host_bytes_ -= e.StorageBytes(s);
  }
  std::optional<std::uint64_t> Value(StorageIndex s) const { return s < value_.size() ? value_[s] : std::nullopt; }
  int failures = 0;
  std::int64_t host_budget = std::numeric_limits<std::int64_t>::max();

 private:
  std::vector<std::optional<std::uint64_t>> host_;
  std::int64_t host_bytes_ = 0;
  Arena* arena_;
  std::int64_t budget_;
  std::vector<std::uint64_t>* golden_;
  std::vector<std::optional<std::uint64_t>> value_;
};

// Builds and runs a random graph (deterministic in `seed`). Returns the engine's final status.
// Prefetch before each op: 1 = Prefetch each input (free memory only), 2 = PrefetchAhead over the inputs, making
// room if needed.
absl::Status RunGraph(std::uint64_t seed, Engine& e, HashExecutor& ex, std::vector<TensorId>* live_out,
                      int prefetch = 0) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<TensorId> live;
  for (int i = 0, n = uniform(1, 3); i < n; ++i) {
    absl::StatusOr<TensorId> c = e.Constant(uniform(1, 64));
    if (!c.ok()) return c.status();
    live.push_back(*c);
  }
  const int ops = uniform(40, 120);
  for (int k = 0; k < ops; ++k) {
    std::vector<TensorId> in;
    for (int i = 0, n = uniform(1, 3); i < n; ++i) in.push_back(live[uniform(0, static_cast<int>(live.size()) - 1)]);
    std::vector<OutputSpec> outs;
    for (int i = 0, n = uniform(1, 2); i < n; ++i) outs.push_back({uniform(1, 100), -1});
    if (uniform(0, 5) == 0) outs.push_back({0, 0});  // a view of the first input
    if (prefetch == 1) {
      for (TensorId t : in) {
        if (absl::StatusOr<bool> p = e.Prefetch(t); !p.ok()) return p.status();
      }
    } else if (prefetch == 2) {
      if (absl::StatusOr<int> p = e.PrefetchAhead(in, /*make_room=*/true); !p.ok()) return p.status();
    }
    absl::StatusOr<std::span<const TensorId>> r = e.Call(in, outs, uniform(1, 20), uniform(0, 3) == 0 ? "mm" : "add");
    if (!r.ok()) return r.status();
    for (TensorId t : *r) live.push_back(t);
    // Drop a random reference now and then (the storage is evicted at once but stays recomputable).
    while (live.size() > 24 || (live.size() > 3 && uniform(0, 3) == 0)) {
      std::size_t i = uniform(0, static_cast<int>(live.size()) - 1);
      e.Release(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (TensorId t : live) {
    if (absl::Status s = e.Rematerialize(t); !s.ok()) return s;
    if (!e.Resident(e.StorageOf(t)) || !ex.Value(e.StorageOf(t))) {
      ADD_FAILURE() << "output not resident at the end";
    }
    e.Release(t);  // checked (its value was compared when it was recomputed); make room for the next
  }
  if (live_out != nullptr) *live_out = live;
  return absl::OkStatus();
}

TEST(EngineRandomTest, EveryPolicyEveryModeRecomputesExactly) {
  int runs = 0, passed = 0;
  for (std::uint64_t seed = 1; seed <= 25; ++seed) {
    std::vector<std::uint64_t> golden;
    std::int64_t peak = 0;
    {
      std::unique_ptr<Policy> p = *MakePolicy("dtr-local");
      HashExecutor ex(nullptr, std::numeric_limits<std::int64_t>::max(), &golden);
      EngineOptions o;
      o.policy = p.get();
      Engine e(o, &ex);
      ASSERT_TRUE(RunGraph(seed, e, ex, nullptr).ok());
      peak = e.stats().peak_bytes;
    }
    std::mt19937_64 rng(seed * 7919);
    for (const std::string& name : PolicyNames()) {
      for (AccountingMode mode : {AccountingMode::kCounter, AccountingMode::kArena}) {
        for (int b = 0; b < 3; ++b) {
          std::int64_t budget =
              static_cast<std::int64_t>(peak * std::uniform_real_distribution<double>(0.3, 1.1)(rng)) + 1;
          std::unique_ptr<Policy> p = *MakePolicy(name);
          std::unique_ptr<Arena> arena;
          if (mode == AccountingMode::kArena) {
            ArenaOptions ao;
            ao.alignment = 8;
            ao.capacity = static_cast<std::size_t>((budget + 7) / 8 * 8);
            arena = *Arena::Create(MakeVirtualProvider(), ao);
          }
          std::vector<std::uint64_t> check = golden;
          HashExecutor ex(arena.get(), budget, &check);
          EngineOptions o;
          o.policy = p.get();
          o.mode = mode;
          o.budget = budget;
          o.seed = seed;
          o.arena = arena.get();
          o.choose.sample_sqrt = b == 2;
          o.free_dead = b == 1;      // the engine's own model: dead storages leave the graph,
          o.replay_views = b != 1;   // views come back with their storage
          Engine e(o, &ex);
          if (arena) arena->SetPressureHandler(&e);
          absl::Status s = RunGraph(seed, e, ex, nullptr);
          if (arena) arena->SetPressureHandler(nullptr);
          ++runs;
          EXPECT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << name << " seed " << seed << ": " << s;
          EXPECT_EQ(ex.failures, 0) << name << " seed " << seed << " budget " << budget;
          if (s.ok()) ++passed;
          if (std::getenv("REMAT_RANDOM_VERBOSE") != nullptr) {
            std::printf("%s %s budget %.2f: %s evictions %lld remats %lld\n", name.c_str(),
                        mode == AccountingMode::kArena ? "arena" : "counter", double(budget) / peak,
                        s.ok() ? "ok" : "oom", (long long)e.stats().evictions, (long long)e.stats().rematerializations);
          }
        }
      }
    }
  }
  std::printf("random graphs: %d runs, %d completed within budget, the rest out of memory\n", runs, passed);
  EXPECT_GT(passed, runs / 3);
}

TEST(EngineRandomTest, PagingEveryPolicyEveryModeKeepsValuesAndBudgets) {
  int runs = 0, passed = 0;
  std::int64_t page_outs = 0, page_ins = 0, evictions = 0, prefetches = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    std::vector<std::uint64_t> golden;
    std::int64_t peak = 0;
    {
      std::unique_ptr<Policy> p = *MakePolicy("dtr-local");
      HashExecutor ex(nullptr, std::numeric_limits<std::int64_t>::max(), &golden);
      EngineOptions o;
      o.policy = p.get();
      Engine e(o, &ex);
      ASSERT_TRUE(RunGraph(seed, e, ex, nullptr).ok());
      peak = e.stats().peak_bytes;
    }
    std::mt19937_64 rng(seed * 104729);
    for (const std::string& name : PolicyNames()) {
      for (AccountingMode mode : {AccountingMode::kCounter, AccountingMode::kArena}) {
        for (OffloadMode offload : {OffloadMode::kAuto, OffloadMode::kAlways}) {
          std::int64_t budget =
              static_cast<std::int64_t>(peak * std::uniform_real_distribution<double>(0.3, 1.0)(rng)) + 1;
          const int variant = std::uniform_int_distribution<int>(0, 7)(rng);
          std::unique_ptr<Policy> p = *MakePolicy(name);
          std::unique_ptr<Arena> arena;
          if (mode == AccountingMode::kArena) {
            ArenaOptions ao;
            ao.alignment = 8;
            ao.capacity = static_cast<std::size_t>((budget + 7) / 8 * 8);
            arena = *Arena::Create(MakeVirtualProvider(), ao);
          }
          std::vector<std::uint64_t> check = golden;
          HashExecutor ex(arena.get(), budget, &check);
          EngineOptions o;
          o.policy = p.get();
          o.mode = mode;
          o.budget = budget;
          o.seed = seed;
          o.arena = arena.get();
          o.free_dead = (variant & 1) != 0;
          o.replay_views = (variant & 1) == 0;
          o.paging.mode = offload;
          // ~0.1 ns per byte and 2 ns latency: transfers cost about as much as the ops (1..20 ns), so auto goes both
          // ways.
          o.paging.bandwidth_bytes_per_s = 1e10;
          o.paging.latency_ns = 2;
          o.paging.page_constants = (variant & 2) != 0;
          o.paging.host_budget = (variant & 4) != 0 ? peak / 4 : std::numeric_limits<std::int64_t>::max();
          o.paging.duplex = seed % 3 == 0;
          ex.host_budget = o.paging.host_budget;
          Engine e(o, &ex);
          if (arena) arena->SetPressureHandler(&e);
          absl::Status s = RunGraph(seed, e, ex, nullptr, /*prefetch=*/static_cast<int>(seed % 3));
          if (arena) arena->SetPressureHandler(nullptr);
          ++runs;
          EXPECT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << name << " seed " << seed << ": " << s;
          EXPECT_EQ(ex.failures, 0) << name << " seed " << seed << " budget " << budget << " variant " << variant;
          EXPECT_LE(e.stats().host_peak_bytes, o.paging.host_budget);
          if (s.ok()) ++passed;
          page_outs += e.stats().page_outs;
          page_ins += e.stats().page_ins;
          prefetches += e.stats().prefetches;
          evictions += e.stats().evictions;
        }
      }
    }
  }
  std::printf("paging random graphs: %d runs, %d completed; %lld page-outs, %lld page-ins (%lld prefetched), "
              "%lld drops\n", runs, passed, (long long)page_outs, (long long)page_ins, (long long)prefetches,
              (long long)evictions);
  EXPECT_GT(passed, runs / 3);
  EXPECT_GT(page_outs, 0);
  EXPECT_GT(page_ins, 0);
  EXPECT_GT(prefetches, 0);
  EXPECT_GT(evictions, 0);  // auto dropped some
}

}  // namespace
}  // namespace remat
