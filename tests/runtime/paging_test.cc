// Paging (second tier) on hand-built graphs: the drop-vs-page choice follows the cost model, paged storages come
// back byte-identical, the host budget holds, ops wait for their own inputs' page-ins (stall) and prefetch hides it.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/arena.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/engine.h"
#include "tests/runtime/value_hash.h"

namespace remat {
namespace {

using ::testing::ElementsAre;

// Keeps a value per storage on the "device" and on the "host"; paging moves it, evicting drops it. Records events
// "run x", "replay x", "drop x", "out x", "in x", "forget x".
class TierExecutor : public Executor {
 public:
  absl::Status Execute(Engine& e, OpId op, bool replay, std::span<const std::uint32_t>) override {
    std::uint64_t h = Mix(7, op);
    for (TensorId in : e.OpInputs(op)) {
      StorageIndex s = e.StorageOf(in);
      if (!e.Resident(s) || !Device(s)) {
        ADD_FAILURE() << "op " << e.OpName(op) << " sees a non-resident input";
        return absl::InternalError("input not resident");
      }
      h = Mix(h, *Device(s));
    }
    std::span<const TensorId> outs = e.OpOutputs(op);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      StorageIndex s = e.StorageOf(outs[i]);
      if (e.ProducerOf(e.StorageRoot(s)) != op) continue;
      Grow(s);
      device[s] = Mix(h, i);
    }
    events.push_back(absl::StrCat(replay ? "replay " : "run ", std::string(e.OpName(op))));
    return absl::OkStatus();
  }
  void Evict(Engine& e, std::uint32_t s) override {
    Grow(s);  // outputs of BeginOp/EndOp ops were never executed here
    device[s].reset();
    events.push_back(absl::StrCat("drop ", Name(e, s)));
  }
  absl::Status PageOut(Engine& e, std::uint32_t s) override {
    Grow(s);
    host[s] = device[s];
    device[s].reset();
    host_bytes += e.StorageBytes(s);
    max_host_bytes = std::max(max_host_bytes, host_bytes);
    events.push_back(absl::StrCat("out ", Name(e, s)));
    return absl::OkStatus();
  }
  absl::Status PageIn(Engine& e, std::uint32_t s) override {
    if (!host[s]) return absl::InternalError("nothing on the host");
    device[s] = host[s];
    host[s].reset();
    host_bytes -= e.StorageBytes(s);
    events.push_back(absl::StrCat("in ", Name(e, s)));
    return absl::OkStatus();
  }
  void DropPaged(Engine& e, std::uint32_t s) override {
    host[s].reset();
    host_bytes -= e.StorageBytes(s);
    events.push_back(absl::StrCat("forget ", Name(e, s)));
  }
  std::optional<std::uint64_t> Device(StorageIndex s) const { return s < device.size() ? device[s] : std::nullopt; }
  std::string Name(Engine& e, StorageIndex s) const { return std::string(e.OpName(e.ProducerOf(e.StorageRoot(s)))); }
  void Grow(StorageIndex s) {
    if (device.size() <= s) device.resize(s + 1);
    if (host.size() <= s) host.resize(s + 1);
  }

  std::vector<std::string> events;
  std::vector<std::optional<std::uint64_t>> device, host;
  std::int64_t host_bytes = 0, max_host_bytes = 0;
};

struct Graph {
  Graph(std::string policy_name, std::int64_t budget, PagingOptions paging) {
    policy = *MakePolicy(policy_name);
    EngineOptions o;
    o.policy = policy.get();
    o.budget = budget;
    o.paging = paging;
    engine = std::make_unique<Engine>(o, &executor);
  }
  TensorId Op(const std::string& name, std::vector<TensorId> in, std::int64_t bytes, std::int64_t cost) {
    OutputSpec out{bytes, -1};
    absl::StatusOr<std::span<const TensorId>> r = engine->Call(in, {&out, 1}, cost, name);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0] : 0;
  }
  std::uint64_t Value(TensorId t) { return executor.Device(engine->StorageOf(t)).value_or(0); }
  std::unique_ptr<Policy> policy;
  TierExecutor executor;
  std::unique_ptr<Engine> engine;
};

PagingOptions Link(OffloadMode mode, double bandwidth, std::int64_t latency = 0) {
  PagingOptions p;
  p.mode = mode;
  p.bandwidth_bytes_per_s = bandwidth;
  p.latency_ns = latency;
  return p;
}

// a (1000 B, cost 10) and b (1000 B, cost 100000), then `big` needs both gone (lru: a first, then b); `use` reads
// both again. Returns the events from `big` on and checks the value `use` computes against an unconstrained run.
std::vector<std::string> CheapAndExpensive(PagingOptions paging, std::int64_t* host_peak = nullptr) {
  std::uint64_t golden;
  {
    Graph g("lru", 1'000'000, PagingOptions{});
    TensorId a = g.Op("a", {}, 1000, 10), b = g.Op("b", {}, 1000, 100000);
    g.engine->Release(g.Op("big", {}, 2001, 1));
    golden = g.Value(g.Op("use", {a, b}, 1, 1));
  }
  Graph f("lru", 2001, paging);
  TensorId a = f.Op("a", {}, 1000, 10), b = f.Op("b", {}, 1000, 100000);
  f.executor.events.clear();
  f.engine->Release(f.Op("big", {}, 2001, 1));
  EXPECT_EQ(f.Value(f.Op("use", {a, b}, 1, 1)), golden) << "a paged or recomputed input came back different";
  EXPECT_LE(f.engine->stats().used_bytes, 2001);
  if (host_peak != nullptr) *host_peak = f.engine->stats().host_peak_bytes;
  return f.executor.events;
}

TEST(PagingTest, AutoDropsTheCheapAndPagesTheExpensive) {
  // 1 B/ns: paging a or b costs 2 x 1000 ns unhidden; a recomputes in 10 ns, b in 100000 ns.
  EXPECT_THAT(CheapAndExpensive(Link(OffloadMode::kAuto, 1e9)),
              ElementsAre("drop a", "out b", "run big", "drop big", "replay a", "in b", "run use"));
}

TEST(PagingTest, AutoWithASlowLinkDropsEverything) {
  // 1 KB/s: a page of 1000 B takes 1 s each way, more than b's 100 us.
  EXPECT_THAT(CheapAndExpensive(Link(OffloadMode::kAuto, 1e3)),
              ElementsAre("drop a", "drop b", "run big", "drop big", "replay a", "replay b", "run use"));
}

TEST(PagingTest, OffDropsEverything) {
  EXPECT_THAT(CheapAndExpensive(Link(OffloadMode::kOff, 1e12)),
              ElementsAre("drop a", "drop b", "run big", "drop big", "replay a", "replay b", "run use"));
}

TEST(PagingTest, AlwaysPagesWhileTheHostBudgetLasts) {
  EXPECT_THAT(CheapAndExpensive(Link(OffloadMode::kAlways, 1e3)),
              ElementsAre("out a", "out b", "run big", "drop big", "in a", "in b", "run use"));
  PagingOptions p = Link(OffloadMode::kAlways, 1e3);
  p.host_budget = 1500;  // room for one
  std::int64_t host_peak = 0;
  EXPECT_THAT(CheapAndExpensive(p, &host_peak),
              ElementsAre("out a", "drop b", "run big", "drop big", "in a", "replay b", "run use"));
  EXPECT_EQ(host_peak, 1000);
}

TEST(PagingTest, PrefersPagingAnswersTheCostModel) {
  Graph f("dtr-eq", 1'000'000, Link(OffloadMode::kAuto, 1e9, 50));
  TensorId a = f.Op("a", {}, 1000, 2099), b = f.Op("b", {}, 1000, 2101);
  // Unhidden: 2 x (50 + 1000) = 2100 ns on an idle link.
  EXPECT_EQ(f.engine->TransferNs(1000), 1050);
  EXPECT_FALSE(f.engine->PrefersPaging(f.engine->StorageOf(a)));
  EXPECT_TRUE(f.engine->PrefersPaging(f.engine->StorageOf(b)));
  // Evicted neighbours count: c = op(a) is cheap itself, but once a is evicted, c's recompute needs a too.
  TensorId c = f.Op("c", {a}, 1000, 10);
  EXPECT_FALSE(f.engine->PrefersPaging(f.engine->StorageOf(c)));
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(a)).ok());
  EXPECT_TRUE(f.engine->PrefersPaging(f.engine->StorageOf(c)));  // 10 + 2099 > 2100
  // A busy link adds its backlog: paging b out now leaves 1050 ns on the link, so c's 2109 no longer beats it.
  ASSERT_TRUE(f.engine->PageOut(f.engine->StorageOf(b)).ok());
  EXPECT_FALSE(f.engine->PrefersPaging(f.engine->StorageOf(c)));
}

TEST(PagingTest, HostBudgetIsNeverExceeded) {
  PagingOptions p = Link(OffloadMode::kAlways, 1e9);
  p.host_budget = 2500;
  Graph f("dtr-eq", 1200, p);
  std::vector<TensorId> kept;
  for (int i = 0; i < 6; ++i) kept.push_back(f.Op(absl::StrCat("x", i), {}, 1000, 100));
  EXPECT_EQ(f.engine->stats().page_outs, 2);  // 2 x 1000 fit in 2500; the other victims were dropped
  EXPECT_LE(f.engine->stats().host_peak_bytes, 2500);
  EXPECT_LE(f.executor.max_host_bytes, 2500);
  StorageIndex last = f.engine->StorageOf(kept.back());
  EXPECT_TRUE(absl::IsResourceExhausted(f.engine->PageOut(last)));  // explicit page-outs obey the budget too
  for (TensorId t : kept) ASSERT_TRUE(f.engine->Rematerialize(t).ok());
  EXPECT_LE(f.engine->stats().used_bytes, 1200);
}

TEST(PagingTest, AnOpWaitsForItsPagedInputInFlight) {
  Graph f("lru", 1'000'000, Link(OffloadMode::kAuto, 1e9, 100));
  TensorId a = f.Op("a", {}, 1000, 10), b = f.Op("b", {}, 1000, 10);
  ASSERT_TRUE(f.engine->PageOut(f.engine->StorageOf(b)).ok());
  const std::int64_t t0 = f.engine->clock();
  EXPECT_EQ(f.engine->LinkFreeAt(), t0 + 1100);  // the page-out holds the link but delays no op
  f.Op("only_a", {a}, 10, 5);
  EXPECT_EQ(f.engine->stats().stall_ns, 0);
  EXPECT_EQ(f.engine->clock(), t0 + 5);
  // b's page-in is queued behind the page-out: it starts at t0 + 1100 and ends 1100 later.
  f.Op("use_b", {b}, 10, 7);
  EXPECT_EQ(f.engine->ReadyAt(f.engine->StorageOf(b)), t0 + 2200);
  EXPECT_EQ(f.engine->stats().stall_ns, t0 + 2200 - (t0 + 5));
  EXPECT_EQ(f.engine->clock(), t0 + 2200 + 7);
  EXPECT_EQ(f.engine->stats().page_ins, 1);
  EXPECT_EQ(f.engine->stats().paged_in_bytes, 1000);
}

TEST(PagingTest, ADuplexLinkLetsAPageInPassQueuedPageOuts) {
  for (bool duplex : {false, true}) {
    PagingOptions p = Link(OffloadMode::kAuto, 1e9);
    p.duplex = duplex;
    Graph f("lru", 1'000'000, p);
    TensorId a = f.Op("a", {}, 1000, 10), b = f.Op("b", {}, 1000, 10);
    const std::int64_t t0 = f.engine->clock();
    ASSERT_TRUE(f.engine->PageOut(f.engine->StorageOf(a)).ok());  // on the link [t0, t0 + 1000)
    ASSERT_TRUE(f.engine->PageOut(f.engine->StorageOf(b)).ok());  // [t0 + 1000, t0 + 2000)
    f.Op("use_a", {a}, 10, 1);
    // One link: a's page-in queues behind b's page-out. Duplex: it only waits for a's own page-out.
    EXPECT_EQ(f.engine->ReadyAt(f.engine->StorageOf(a)), duplex ? t0 + 2000 : t0 + 3000);
    EXPECT_EQ(f.engine->stats().stall_ns, duplex ? 2000 : 3000);
  }
}

// Eight weights, each read by one op of a chain that runs twice; between the iterations every weight is paged
// out. In the second iteration each op waits for its weight, unless the weight of the next op (the order seen in
// the first iteration) is prefetched while the current op computes.
std::int64_t ChainStall(bool prefetch) {
  PagingOptions p = Link(OffloadMode::kAuto, 2.5e9, 10);  // 1000 B: 410 ns, under the ops' 500 ns
  p.page_constants = true;
  Graph f("dtr-eq", 1'000'000, p);
  std::vector<TensorId> w;
  for (int i = 0; i < 8; ++i) w.push_back(*f.engine->Constant(1000, "w"));
  std::vector<std::uint64_t> before;
  for (int iteration = 0; iteration < 2; ++iteration) {
    TensorId x = f.Op("input", {}, 100, 1);
    if (iteration == 1 && prefetch) {
      EXPECT_TRUE(*f.engine->Prefetch(w[0]));
    }
    for (int i = 0; i < 8; ++i) {
      if (iteration == 1 && prefetch && i + 1 < 8) {
        EXPECT_TRUE(*f.engine->Prefetch(w[i + 1]));
      }
      TensorId y = f.Op("layer", {x, w[i]}, 100, 500);
      f.engine->Release(x);
      x = y;
      if (iteration == 1) {
        EXPECT_EQ(f.Value(w[i]), before[i]) << "weight " << i << " came back different";
      }
    }
    f.engine->Release(x);
    if (iteration == 0) {
      for (TensorId t : w) before.push_back(f.Value(t));
      for (TensorId t : w) EXPECT_TRUE(f.engine->PageOut(f.engine->StorageOf(t)).ok());
      EXPECT_TRUE(f.engine->Call({}, {}, 100000, "idle").ok());  // the link drains
    }
  }
  EXPECT_EQ(f.engine->stats().page_outs, 8);
  EXPECT_EQ(f.engine->stats().page_ins, 8);
  EXPECT_EQ(f.engine->stats().prefetches, prefetch ? 8 : 0);
  return f.engine->stats().stall_ns;
}

TEST(PagingTest, PrefetchHidesTransfersOnARepeatingChain) {
  const std::int64_t without = ChainStall(false), with = ChainStall(true);
  EXPECT_EQ(without, 8 * 410);
  EXPECT_EQ(with, 410);  // only the first weight: its prefetch has nothing to overlap
}

TEST(PagingTest, PrefetchAheadUsesFreeMemoryOrMakesRoomWhenAsked) {
  for (bool make_room : {false, true}) {
    Graph f("lru", 3000, Link(OffloadMode::kAlways, 1e9));
    TensorId a = f.Op("a", {}, 1000, 10), b = f.Op("b", {}, 1000, 10), c = f.Op("c", {}, 1000, 10);
    ASSERT_TRUE(f.engine->PageOut(f.engine->StorageOf(a)).ok());
    TensorId d = f.Op("d", {}, 1000, 10);  // memory full again: b, c, d
    // The next ops read a (paged) and c (resident): a may come back only by making room, and c must stay.
    std::vector<TensorId> upcoming = {a, c};
    absl::StatusOr<int> issued = f.engine->PrefetchAhead(upcoming, make_room);
    ASSERT_TRUE(issued.ok()) << issued.status();
    EXPECT_EQ(*issued, make_room ? 1 : 0);
    EXPECT_EQ(f.engine->Resident(f.engine->StorageOf(a)), make_room);
    EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(c)));
    if (make_room) {
      EXPECT_FALSE(f.engine->Resident(f.engine->StorageOf(b)));  // the least recently used one that is not held
      EXPECT_TRUE(f.engine->Paged(f.engine->StorageOf(b)));
      EXPECT_EQ(f.engine->stats().prefetches, 1);
    }
    EXPECT_LE(f.engine->stats().used_bytes, 3000);
    f.Op("use", {a, c, d}, 0, 1);  // every input resident, values checked by the executor
  }
}

TEST(PagingTest, ConstantsArePagedOnlyWhenAllowedAndAsALastResort) {
  for (bool allowed : {false, true}) {
    PagingOptions p = Link(OffloadMode::kAuto, 1e9);
    p.page_constants = allowed;
    Graph f("dtr-eq", 2500, p);
    TensorId w1 = *f.engine->Constant(1000, "w1");
    TensorId w2 = *f.engine->Constant(1000, "w2");
    OutputSpec out{1000, -1};
    std::vector<TensorId> in2 = {w2}, in1 = {w1};
    absl::StatusOr<std::span<const TensorId>> r = f.engine->Call(in2, {&out, 1}, 10, "needs_w1_gone");
    EXPECT_EQ(r.ok(), allowed) << r.status();
    if (!allowed) {
      EXPECT_TRUE(absl::IsResourceExhausted(r.status()));
      continue;
    }
    EXPECT_TRUE(f.engine->Paged(f.engine->StorageOf(w1)));  // w2 is an input (locked); w1 is the only choice
    TensorId y = (*r)[0];
    f.engine->Release(y);
    OutputSpec small{10, -1};
    ASSERT_TRUE(f.engine->Call(in1, {&small, 1}, 10, "reads_w1").ok());
    EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(w1)));
  }
}

// An executor that cannot page: an engine told to page fails its call with Unimplemented, and nothing is lost.
class NoPagingExecutor : public Executor {
 public:
  absl::Status Execute(Engine&, OpId, bool, std::span<const std::uint32_t>) override { return absl::OkStatus(); }
  void Evict(Engine&, std::uint32_t) override { ++evictions; }
  int evictions = 0;
};

// Places outputs in the arena (whose pressure handler is the engine) and frees evicted ones; counts evictions.
class ArenaPlacingExecutor : public Executor {
 public:
  explicit ArenaPlacingExecutor(Arena* arena) : arena_(arena) {}
  absl::Status Execute(Engine& e, OpId, bool, std::span<const std::uint32_t> fresh) override {
    for (std::uint32_t s : fresh) {
      e.NoteAllocation();
      absl::StatusOr<std::uintptr_t> a = arena_->Allocate(e.StorageBytes(s), OwnerId{s} + 1);
      if (!a.ok()) return a.status();
      e.SetAddress(s, *a);
    }
    return absl::OkStatus();
  }
  void Evict(Engine& e, std::uint32_t s) override {
    ++evictions;
    (void)arena_->Free(e.StorageAddress(s));
  }
  int evictions = 0;

 private:
  Arena* arena_;
};

// Cannot write page-outs: a full disk.
class FullDiskExecutor : public ArenaPlacingExecutor {
 public:
  using ArenaPlacingExecutor::ArenaPlacingExecutor;
  absl::Status PageOut(Engine&, std::uint32_t) override {
    return absl::UnavailableError("writing the page-out failed: No space left on device");
  }
};

// A 2000-byte virtual arena whose pressure handler is an engine that always pages (dtr-eq), over executor X.
template <typename X>
struct PagingArena {
  static ArenaOptions Options() {
    ArenaOptions ao;
    ao.alignment = 8;
    ao.capacity = 2000;
    return ao;
  }
  static EngineOptions EngineOptionsFor(const Policy* policy, Arena* arena) {
    EngineOptions o;
    o.policy = policy;
    o.mode = AccountingMode::kArena;
    o.budget = 2000;
    o.arena = arena;
    o.paging.mode = OffloadMode::kAlways;
    return o;
  }
  PagingArena() { arena->SetPressureHandler(&engine); }
  ~PagingArena() { arena->SetPressureHandler(nullptr); }
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), Options());
  X executor{arena.get()};
  Engine engine{EngineOptionsFor(policy.get(), arena.get()), &executor};
};

// A page-out that cannot be written is the error of the op that needed the room, with its cause and code: not an
// out-of-memory error (there was a victim), and nothing is lost (the victim stays resident).
TEST(PagingTest, AFailedPageOutIsTheOpsErrorWithItsCause) {
  PagingArena<FullDiskExecutor> f;
  Engine& e = f.engine;
  OutputSpec out{1000, -1};
  const TensorId a = (*e.Call({}, {&out, 1}, 10, "a"))[0];
  const TensorId b = (*e.Call({}, {&out, 1}, 10, "b"))[0];
  absl::StatusOr<std::span<const TensorId>> r = e.Call({}, {&out, 1}, 10, "c");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(std::string(r.status().message()), testing::HasSubstr("No space left on device"));
  EXPECT_TRUE(e.Resident(e.StorageOf(a)));
  EXPECT_TRUE(e.Resident(e.StorageOf(b)));
  EXPECT_EQ(e.stats().page_outs, 0);
  // The engine goes on: once b is released (evicted), c fits.
  e.Release(b);
  EXPECT_TRUE(e.Call({}, {&out, 1}, 10, "c").ok());
}

// A victim whose bytes are gone already (its last holder died before the engine heard of it: PageOut says
// NotFound) is dropped instead of paged, and the op goes on.
class GoneBytesExecutor : public ArenaPlacingExecutor {
 public:
  using ArenaPlacingExecutor::ArenaPlacingExecutor;
  absl::Status PageOut(Engine&, std::uint32_t s) override {
    return absl::NotFoundError(absl::StrCat("storage ", s, ": its bytes are gone"));
  }
};

TEST(PagingTest, AVictimWhoseBytesAreGoneIsDroppedInsteadOfPaged) {
  PagingArena<GoneBytesExecutor> f;
  Engine& e = f.engine;
  GoneBytesExecutor& ex = f.executor;
  OutputSpec out{1000, -1};
  (void)*e.Call({}, {&out, 1}, 10, "a");
  (void)*e.Call({}, {&out, 1}, 10, "b");
  absl::StatusOr<std::span<const TensorId>> c = e.Call({}, {&out, 1}, 10, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(ex.evictions, 1);
  EXPECT_EQ(e.stats().page_outs, 0);
  EXPECT_EQ(e.stats().host_used_bytes, 0);
}

TEST(PagingTest, AnExecutorWithoutPagingFailsLoudly) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  for (AccountingMode mode : {AccountingMode::kCounter, AccountingMode::kArena}) {
    std::unique_ptr<Arena> arena;
    if (mode == AccountingMode::kArena) {
      ArenaOptions ao;
      ao.alignment = 8;
      ao.capacity = 2000;
      arena = *Arena::Create(MakeVirtualProvider(), ao);
    }
    NoPagingExecutor ex;
    EngineOptions o;
    o.policy = policy.get();
    o.mode = mode;
    o.budget = 2000;
    o.arena = arena.get();
    o.paging.mode = OffloadMode::kAlways;
    Engine e(o, &ex);
    if (arena) arena->SetPressureHandler(&e);
    OutputSpec out{1000, -1};
    // In arena mode the test executor does not place anything, so only counter mode ever needs room.
    ASSERT_TRUE(e.Call({}, {&out, 1}, 10, "a").ok());
    ASSERT_TRUE(e.Call({}, {&out, 1}, 10, "b").ok());
    absl::StatusOr<std::span<const TensorId>> r = e.Call({}, {&out, 1}, 10, "c");
    if (mode == AccountingMode::kCounter) {
      EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
      EXPECT_EQ(e.stats().page_outs, 0);
      EXPECT_EQ(e.stats().used_bytes, 2000);  // a and b still resident
    }
    EXPECT_EQ(ex.evictions, 0);
    EXPECT_TRUE(absl::IsUnimplemented(e.PageOut(0)));
    EXPECT_TRUE(e.Resident(0));
    if (arena) arena->SetPressureHandler(nullptr);
  }
}

// PagingOptions::prefetch: a forward pass of eight layers pages its activations out, a backward pass reads them in
// reverse (as BeginOp/EndOp ops, the way the PyTorch bridge runs them). From the second step on the engine knows the
// order the first read them in and brings the next one back while the op before runs (20 us, two copies' time):
// less stall than paging in on demand.
std::int64_t StallOfTwoSteps(bool prefetch, std::int64_t* prefetches) {
  PagingOptions p = Link(OffloadMode::kAlways, 1e8);  // 1000 B take 10 us: far longer than an op
  p.prefetch = prefetch;
  Graph g("dtr-eq", 4500, p);
  const TensorId x = *g.engine->Constant(100, "x");
  for (int step = 0; step < 2; ++step) {
    std::vector<TensorId> acts;
    TensorId y = x;
    for (int i = 0; i < 8; ++i) {
      y = g.Op(absl::StrCat("f", i), {y}, 1000, 1000);
      acts.push_back(y);
    }
    for (int i = 7; i >= 0; --i) {
      const TensorId in[] = {acts[i]};
      absl::StatusOr<OpId> op = g.engine->BeginOp(in, absl::StrCat("b", i));
      EXPECT_TRUE(op.ok()) << op.status();
      if (!op.ok()) return -1;
      OutputSpec out{10, -1};
      absl::StatusOr<std::span<const TensorId>> r = g.engine->EndOp(*op, {&out, 1}, 20000);  // ~ two copies
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) g.engine->Release((*r)[0]);
    }
    for (TensorId t : acts) g.engine->Release(t);
  }
  *prefetches = g.engine->stats().prefetches;
  return g.engine->stats().stall_ns;
}

TEST(PagingTest, PrefetchInThePreviousPassOrderHidesStall) {
  std::int64_t without_prefetches = 0, with_prefetches = 0;
  const std::int64_t without = StallOfTwoSteps(false, &without_prefetches);
  const std::int64_t with = StallOfTwoSteps(true, &with_prefetches);
  EXPECT_EQ(without_prefetches, 0);
  EXPECT_GT(with_prefetches, 0);
  EXPECT_GT(without, 0);
  EXPECT_LT(with, without);
  std::printf("[ figures ] stall over two steps: %lld us on demand, %lld us with %lld prefetches\n",
              static_cast<long long>(without / 1000), static_cast<long long>(with / 1000),
              static_cast<long long>(with_prefetches));
}

}  // namespace
}  // namespace remat
