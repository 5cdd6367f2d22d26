// Hand-built graphs with the exact eviction and replay sequence of each policy (counter mode, prototype semantics).
#include "runtime/engine.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "allocator/arena.h"
#include "policies/registry.h"

namespace remat {
namespace {

using ::testing::ElementsAre;

// Records "run <op>", "replay <op>" and "evict <storage>" events.
class RecordingExecutor : public Executor {
 public:
  absl::Status Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t>) override {
    for (TensorId in : engine.OpInputs(op)) EXPECT_TRUE(engine.Resident(engine.StorageOf(in)));
    events.push_back(absl::StrCat(replay ? "replay " : "run ", std::string(engine.OpName(op))));
    return absl::OkStatus();
  }
  void Evict(Engine& engine, std::uint32_t s) override {
    events.push_back(absl::StrCat("evict ", s < names.size() ? names[s] : absl::StrCat(s)));
  }
  std::vector<std::string> events;
  std::vector<std::string> names;  // storage index -> label
};

struct Fixture {
  explicit Fixture(std::string policy_name, std::int64_t budget, bool replay_views = true,
                   std::int64_t last_resort_bytes = 0) {
    policy = *MakePolicy(policy_name);
    EngineOptions o;
    o.policy = policy.get();
    o.budget = budget;
    o.replay_views = replay_views;
    o.last_resort_bytes = last_resort_bytes;
    engine = std::make_unique<Engine>(o, &executor);
  }
  TensorId Const(const std::string& label, std::int64_t bytes) {
    TensorId t = *engine->Constant(bytes);
    Name(t, label);
    return t;
  }
  TensorId Op(const std::string& label, std::vector<TensorId> in, std::int64_t bytes, std::int64_t cost) {
    OutputSpec out{bytes, -1};
    absl::StatusOr<std::span<const TensorId>> r = engine->Call(in, {&out, 1}, cost, label);
    EXPECT_TRUE(r.ok()) << r.status();
    TensorId t = (*r)[0];
    Name(t, label);
    return t;
  }
  // An op that writes inputs[0] in place (BeginOp/EndOp, as the PyTorch path runs it); returns the new value.
  TensorId WriteInPlace(const std::string& label, std::vector<TensorId> inputs) {
    absl::StatusOr<OpId> op = engine->BeginOp(inputs, label);
    EXPECT_TRUE(op.ok()) << op.status();
    OutputSpec out;
    out.in_place_of = 0;
    absl::StatusOr<std::span<const TensorId>> r = engine->EndOp(*op, {&out, 1}, 3);
    EXPECT_TRUE(r.ok()) << r.status();
    return (*r)[0];
  }
  void Name(TensorId t, const std::string& label) {
    StorageIndex s = engine->StorageOf(t);
    if (executor.names.size() <= s) executor.names.resize(s + 1);
    if (executor.names[s].empty()) executor.names[s] = label;
  }
  std::unique_ptr<Policy> policy;
  RecordingExecutor executor;
  std::unique_ptr<Engine> engine;
};

// a (constant, 10 B); b, c, d = ops on a (100, 200, 100 B; cost 10, 10, 40); e = op on a (100 B) needs an eviction.
// Clock: b done at 11, c at 21, d at 61. At e, staleness b 50, c 40, d 0.
std::vector<std::string> FanOut(const std::string& policy, std::vector<std::string>* after_reuse = nullptr) {
  Fixture f(policy, 410);
  TensorId a = f.Const("a", 10);
  TensorId b = f.Op("b", {a}, 100, 10);
  TensorId c = f.Op("c", {a}, 200, 10);
  f.Op("d", {a}, 100, 40);
  f.Op("e", {a}, 100, 1);
  std::vector<std::string> first = f.executor.events;
  if (after_reuse != nullptr) {
    f.executor.events.clear();
    f.Op("f", {b, c}, 10, 1);
    *after_reuse = f.executor.events;
  }
  return first;
}

TEST(EngineTest, FanOutVictimPerPolicy) {
  // dtr-local: b 10/(100*50) = .002, c 10/(200*40) = .00125, d infinite -> c.
  EXPECT_THAT(FanOut("dtr-local"), ElementsAre("run constant", "run b", "run c", "run d", "evict c", "run e"));
  EXPECT_THAT(FanOut("dtr"), ElementsAre("run constant", "run b", "run c", "run d", "evict c", "run e"));
  EXPECT_THAT(FanOut("dtr-eq"), ElementsAre("run constant", "run b", "run c", "run d", "evict c", "run e"));
  // msps: c(s)/m: b .1, c .05, d .4 -> c.
  EXPECT_THAT(FanOut("msps"), ElementsAre("run constant", "run b", "run c", "run d", "evict c", "run e"));
  // lru: oldest access is b (11).
  EXPECT_THAT(FanOut("lru"), ElementsAre("run constant", "run b", "run c", "run d", "evict b", "run e"));
  // largest: c (200 B).
  EXPECT_THAT(FanOut("largest"), ElementsAre("run constant", "run b", "run c", "run d", "evict c", "run e"));
}

// Deferring c (the policy's victim in FanOut) makes the policy take the next best, d; only when nothing else is left
// does c go.
TEST(EngineTest, DeferredStoragesGoOnlyWhenThePoolIsEmpty) {
  Fixture f("dtr-local", 410);
  TensorId a = f.Const("a", 10);
  f.Op("b", {a}, 100, 10);
  TensorId c = f.Op("c", {a}, 200, 10);
  f.engine->Defer(c);
  f.Op("d", {a}, 100, 40);
  f.Op("e", {a}, 100, 1);  // needs 100 B: b (staleness 50) rather than c
  f.Op("g", {a}, 300, 1);  // needs 300 B: d and e, the whole pool; then c
  EXPECT_THAT(f.executor.events, ElementsAre("run constant", "run b", "run c", "run d", "evict b", "run e",
                                             "evict d", "evict e", "evict c", "run g"));
  EXPECT_EQ(f.engine->stats().deferred_releases, 1);
}

TEST(EngineTest, AnEmptyPoolReleasesOneDeferredVictimNotAll) {
  Fixture f("dtr-local", 300);
  TensorId a = f.Const("a", 10);
  f.engine->Defer(f.Op("c", {a}, 100, 10));
  f.engine->Defer(f.Op("c2", {a}, 100, 10));
  f.Op("h", {a}, 100, 1000);  // the pool is empty: one deferred storage goes (c, the staler)
  f.Op("i", {a}, 100, 1000);  // h, dear as it is, goes before c2, which stayed deferred
  EXPECT_THAT(f.executor.events, ElementsAre("run constant", "run c", "run c2", "evict c", "run h", "evict h",
                                             "run i"));
  EXPECT_EQ(f.engine->stats().deferred_releases, 1);
}

// A fresh storage of at most last_resort_bytes (a 4-byte loss the program keeps past its backward pass) goes only
// once nothing else is left, stale as it is; with 0, the DTR paper's configuration, it is an ordinary candidate.
TEST(EngineTest, SmallResultsGoOnlyWhenNothingElseIsLeft) {
  Fixture paper("lru", 212);
  TensorId a = paper.Const("a", 10);
  paper.Op("loss", {a}, 4, 1000);
  paper.Op("b", {a}, 100, 1);
  paper.Op("c", {a}, 100, 1);  // 2 bytes short: the stalest goes, the loss
  EXPECT_THAT(paper.executor.events, ElementsAre("run constant", "run loss", "run b", "evict loss", "run c"));

  Fixture f("lru", 212, /*replay_views=*/true, /*last_resort_bytes=*/8);
  a = f.Const("a", 10);
  f.Op("loss", {a}, 4, 1000);
  f.Op("b", {a}, 100, 1);
  f.Op("c", {a}, 100, 1);  // b goes instead
  f.Op("d", {a}, 190, 1);  // c goes
  f.Op("e", {a}, 200, 1);  // d goes, and only then, with the pool empty, the loss
  EXPECT_THAT(f.executor.events, ElementsAre("run constant", "run loss", "run b", "evict b", "run c", "evict c",
                                             "run d", "evict d", "evict loss", "run e"));
  EXPECT_EQ(f.engine->stats().deferred_releases, 1);
}

TEST(EngineTest, ReuseRematerializesAndEvictsAgain) {
  std::vector<std::string> reuse;
  FanOut("dtr-local", &reuse);
  // f(b, c): c is replayed (needs 200 B: d, staleness 1, is evicted; e is fresh and infinite), then f's 10 B evict
  // e (b and c are locked).
  EXPECT_THAT(reuse, ElementsAre("evict d", "replay c", "evict e", "run f"));
}

TEST(EngineTest, ChainRecomputesAncestorsInOrder) {
  Fixture f("lru", 1000);
  TensorId a = f.Const("a", 10);
  TensorId x1 = f.Op("x1", {a}, 100, 1);
  TensorId x2 = f.Op("x2", {x1}, 100, 1);
  TensorId x3 = f.Op("x3", {x2}, 100, 1);
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x3)).ok());
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x2)).ok());
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x1)).ok());
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(x3).ok());
  EXPECT_THAT(f.executor.events, ElementsAre("replay x1", "replay x2", "replay x3"));
  EXPECT_EQ(f.engine->stats().rematerializations, 3);
  EXPECT_EQ(f.engine->stats().remat_compute, 3);
}

TEST(EngineTest, DiamondRematerializesBothBranchesOnce) {
  Fixture f("dtr-eq", 1000);
  TensorId a = f.Const("a", 10);
  TensorId b = f.Op("b", {a}, 100, 3);
  TensorId c = f.Op("c", {a}, 100, 5);
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(b)).ok());
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(c)).ok());
  f.executor.events.clear();
  f.Op("d", {b, c}, 100, 1);
  EXPECT_THAT(f.executor.events, ElementsAre("replay b", "replay c", "run d"));
  EXPECT_EQ(f.engine->stats().remat_compute, 8);
}

TEST(EngineTest, EqClassMergesEvictedNeighbours) {
  // y (cost 4) is made first; then the chain a -> x1 -> x2 -> x3 (costs 2, 3, 1); x1 and x2 are evicted, so x3's
  // eq neighbourhood is the class {x1, x2} (cost 5). A 0-byte op w ages everything by 10. At z: staleness y 16,
  // x3 10. dtr-local: x3 1/(100*10) < y 4/(100*16) -> x3. dtr-eq: x3 (1+5)/(100*10) > y -> y.
  for (const char* policy : {"dtr-local", "dtr-eq", "dtr"}) {
    Fixture f(policy, 410);
    TensorId a = f.Const("a", 10);
    f.Op("y", {a}, 100, 4);
    TensorId x1 = f.Op("x1", {a}, 100, 2);
    TensorId x2 = f.Op("x2", {x1}, 100, 3);
    f.Op("x3", {x2}, 100, 1);
    ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x1)).ok());
    ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x2)).ok());
    f.Op("w", {a}, 0, 10);
    f.executor.events.clear();
    f.Op("z", {a}, 300, 1);
    EXPECT_THAT(f.executor.events,
                ElementsAre(std::string(policy) == "dtr-local" ? "evict x3" : "evict y", "run z"))
        << policy;
  }
}

TEST(EngineTest, MultiOutputOpIsReplayedAsAWhole) {
  Fixture f("lru", 1000);
  TensorId a = f.Const("a", 10);
  OutputSpec outs[2] = {{100, -1}, {50, -1}};
  std::span<const TensorId> r = *f.engine->Call(std::vector<TensorId>{a}, outs, 7, "split");
  TensorId x = r[0], y = r[1];
  f.Name(x, "x");
  f.Name(y, "y");
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x)).ok());
  std::int64_t used = f.engine->stats().used_bytes;
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(x).ok());
  EXPECT_THAT(f.executor.events, ElementsAre("replay split"));
  EXPECT_TRUE(f.engine->Defined(y));
  // y was resident: counted again during the replay and subtracted after (the prototype's accounting).
  EXPECT_EQ(f.engine->stats().used_bytes, used + 100);
  EXPECT_EQ(f.engine->stats().peak_bytes, used + 150);
}

TEST(EngineTest, ViewsReplayTheirViewOpOnlyInPrototypeMode) {
  for (bool replay_views : {true, false}) {
    Fixture f("lru", 1000, replay_views);
    TensorId a = f.Const("a", 10);
    TensorId b = f.Op("b", {a}, 100, 5);
    OutputSpec view{0, 0};
    TensorId v = (*f.engine->Call(std::vector<TensorId>{b}, {&view, 1}, 2, "view"))[0];
    EXPECT_EQ(f.engine->StorageOf(v), f.engine->StorageOf(b));
    EXPECT_EQ(f.engine->stats().used_bytes, 110);  // a view adds no bytes
    ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(b)).ok());
    EXPECT_FALSE(f.engine->Defined(v));
    f.executor.events.clear();
    f.Op("use", {v}, 10, 1);
    if (replay_views) {
      EXPECT_THAT(f.executor.events, ElementsAre("replay b", "replay view", "run use"));
    } else {
      EXPECT_THAT(f.executor.events, ElementsAre("replay b", "run use"));
    }
  }
}

TEST(EngineTest, ReleasedStorageIsEvictedAtOnceButStaysRecomputable) {
  Fixture f("lru", 1000);
  TensorId a = f.Const("a", 10);
  TensorId b = f.Op("b", {a}, 100, 5);
  TensorId c = f.Op("c", {b}, 100, 5);
  f.engine->Release(b);
  EXPECT_FALSE(f.engine->Resident(f.engine->StorageOf(b)));
  EXPECT_EQ(f.engine->stats().release_evictions, 1);
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(c)).ok());
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(c).ok());
  EXPECT_THAT(f.executor.events, ElementsAre("replay b", "replay c"));
  // Constants are never evicted, even when released.
  f.engine->Release(a);
  EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(a)));
}

// A released storage that the replay of an evicted, still referenced storage reads stays resident (the replay
// finds it) until the next pressure event, which drops it before the policy chooses; one nothing evicted reads is
// dropped at once, as before (so a run that never evicts under pressure holds what eager eviction holds).
TEST(EngineTest, AReleasedStorageAnEvictedOnesReplayReadsStaysUntilPressure) {
  Fixture f("lru", 1000);
  TensorId a = f.Const("a", 10);
  TensorId b = f.Op("b", {a}, 100, 5);
  TensorId c = f.Op("c", {b}, 100, 5);
  TensorId d = f.Op("d", {a}, 100, 5);
  TensorId e = f.Op("e", {d}, 100, 5);
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(c)).ok());  // c is still referenced: its replay reads b
  f.engine->Release(b, /*keep_if_replays_read=*/true);
  f.engine->Release(d, /*keep_if_replays_read=*/true);  // e is resident: nothing evicted reads d
  EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(b)));
  EXPECT_FALSE(f.engine->Resident(f.engine->StorageOf(d)));
  EXPECT_EQ(f.engine->stats().release_evictions, 1);
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(c).ok());
  EXPECT_THAT(f.executor.events, ElementsAre("replay c"));  // b was there
  // 410 bytes in use (a, b, c, e); 700 more do not fit: b goes first, then the policy's victims.
  f.executor.events.clear();
  f.Op("big", {a}, 700, 5);
  ASSERT_FALSE(f.executor.events.empty());
  EXPECT_EQ(f.executor.events[0], "evict b");
  EXPECT_EQ(f.engine->stats().release_evictions, 2);
  EXPECT_FALSE(f.engine->Resident(f.engine->StorageOf(b)));
  // Still recomputable (the policy makes room for the replay as it needs).
  if (f.engine->Resident(f.engine->StorageOf(c))) {
    ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(c)).ok());
  }
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(c).ok());
  std::erase_if(f.executor.events, [](const std::string& event) { return event.starts_with("evict"); });
  EXPECT_THAT(f.executor.events, ElementsAre("replay b", "replay c"));
  (void)e;
}

// The report's constant bytes are those of the constants alive: a result pinned for good and then written in place
// (a gradient the optimizer updates) adds its new value only, and a released constant whose bytes go leaves them.
TEST(EngineTest, TheReportCountsTheConstantsAliveOnly) {
  EngineOptions o;
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  o.policy = policy.get();
  o.budget = 400;
  o.free_released_constants = true;
  RecordingExecutor executor;
  Engine engine(o, &executor);
  const TensorId a = *engine.Constant(100);
  const TensorId b = *engine.Constant(60);
  OutputSpec out{50, -1};
  const TensorId x = (*engine.Call(std::vector<TensorId>{a}, {&out, 1}, 1, "x"))[0];
  engine.Pin(x);  // a result pinned for good: not a constant
  absl::StatusOr<OpId> op = engine.BeginOp(std::vector<TensorId>{x}, "write_x");
  ASSERT_TRUE(op.ok()) << op.status();
  OutputSpec in_place{0, -1};
  in_place.in_place_of = 0;
  ASSERT_TRUE(engine.EndOp(*op, {&in_place, 1}, 1).ok());  // its new value is a constant (50 bytes)
  engine.Release(b);  // a released constant's bytes go back
  OutputSpec big{1000, -1};
  absl::StatusOr<std::span<const TensorId>> r = engine.Call(std::vector<TensorId>{a}, {&big, 1}, 1, "big");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("constant 150"));
}

TEST(EngineTest, OutOfMemoryIsAClearError) {
  Fixture f("dtr-eq", 150);
  TensorId a = f.Const("a", 100);
  OutputSpec out{100, -1};
  absl::StatusOr<std::span<const TensorId>> r = f.engine->Call(std::vector<TensorId>{a}, {&out, 1}, 1, "big");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(r.status()));
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("requested 100 bytes"));
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("constant 100"));
}

// z reads a (200 B) and e (100 B, computed from p, 100 B), all three evicted when z runs (lru evicts a to make e;
// then e and p are evicted). Under 400 B, DTR's order replays a and locks it, replays p for e, and then e's replay
// needs 10 + 200 + 100 + 100 B with a and p locked: out of memory. Gathering late (the retry, which starts from
// there: a and p resident), e's replay comes first and may evict a; a is replayed in turn while e stays locked.
absl::Status RunZAfterEvictingItsChain(bool retry, std::vector<std::string>* events, std::int64_t* late_gathers) {
  Fixture f("lru", 400);
  EngineOptions o;
  o.policy = f.policy.get();
  o.budget = 400;
  o.retry_gathering_late = retry;
  f.engine = std::make_unique<Engine>(o, &f.executor);
  TensorId k = f.Const("k", 10);
  TensorId a = f.Op("a", {k}, 200, 1);
  TensorId p = f.Op("p", {k}, 100, 1);
  TensorId e = f.Op("e", {p}, 100, 1);
  EXPECT_TRUE(f.engine->Evict(f.engine->StorageOf(e)).ok());
  EXPECT_TRUE(f.engine->Evict(f.engine->StorageOf(p)).ok());
  f.executor.events.clear();
  OutputSpec out{50, -1};
  absl::StatusOr<std::span<const TensorId>> z = f.engine->Call(std::vector<TensorId>{a, e}, {&out, 1}, 1, "z");
  *events = f.executor.events;
  *late_gathers = f.engine->stats().late_gathers;
  return z.status();
}

TEST(EngineTest, RunningOutWhileGatheringRetriesReplayingTheEvictedInputsFirst) {
  std::vector<std::string> events;
  std::int64_t late_gathers = 0;
  absl::Status dtr_order = RunZAfterEvictingItsChain(/*retry=*/false, &events, &late_gathers);
  EXPECT_TRUE(absl::IsResourceExhausted(dtr_order)) << dtr_order;
  EXPECT_EQ(late_gathers, 0);
  absl::Status retried = RunZAfterEvictingItsChain(/*retry=*/true, &events, &late_gathers);
  ASSERT_TRUE(retried.ok()) << retried;
  EXPECT_EQ(late_gathers, 1);
  // The first try replays a and p and runs out replaying e; the second evicts a for e, then p for a's replay.
  EXPECT_THAT(events, ElementsAre("replay a", "replay p", "evict a", "replay e", "evict p", "replay a", "run z"));
}

TEST(EngineTest, ThrashLimitAborts) {
  std::unique_ptr<Policy> policy = *MakePolicy("lru");
  RecordingExecutor ex;
  EngineOptions o;
  o.policy = policy.get();
  o.remat_limit = 5;
  Engine e(o, &ex);
  TensorId a = *e.Constant(10);
  OutputSpec out{10, -1};
  TensorId b = (*e.Call(std::vector<TensorId>{a}, {&out, 1}, 6, "b"))[0];
  ASSERT_TRUE(e.Evict(e.StorageOf(b)).ok());
  absl::Status s = e.Rematerialize(b);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
}

TEST(EngineTest, HundredThousandOpChainRematerializesWithoutRecursion) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-local");
  RecordingExecutor ex;
  EngineOptions o;
  o.policy = policy.get();
  Engine e(o, &ex);
  TensorId prev = *e.Constant(8);
  OutputSpec out{8, -1};
  TensorId first = prev;
  for (int i = 0; i < 100000; ++i) {
    TensorId t = (*e.Call(std::vector<TensorId>{prev}, {&out, 1}, 1, "step"))[0];
    if (prev != first) e.Release(prev);  // evicted at once, still recomputable
    prev = t;
  }
  ASSERT_TRUE(e.Evict(e.StorageOf(prev)).ok());
  ex.events.clear();
  ASSERT_TRUE(e.Rematerialize(prev).ok());
  EXPECT_EQ(ex.events.size(), 100000u);
  EXPECT_EQ(e.stats().rematerializations, 100000);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// The PyTorch-style split: the caller runs kernels and allocates through the arena itself; the engine evicts when
// the arena calls its pressure handler and replays through the executor.
class ArenaExecutor : public Executor {
 public:
  explicit ArenaExecutor(Arena* arena) : arena(arena) {}
  absl::Status Execute(Engine& e, OpId op, bool replay, std::span<const std::uint32_t> fresh) override {
    replays += replay ? 1 : 0;
    for (std::uint32_t s : fresh) {
      absl::StatusOr<std::uintptr_t> a = arena->Allocate(e.StorageBytes(s), OwnerId{s} + 1);
      if (!a.ok()) return a.status();
      e.SetAddress(s, *a);
    }
    return absl::OkStatus();
  }
  void Evict(Engine& e, std::uint32_t s) override {
    ++evictions;
    EXPECT_TRUE(arena->Free(e.StorageAddress(s)).ok());
  }
  Arena* arena;
  int replays = 0, evictions = 0;
};

// Replaying a multi-output op whose other output is still resident: placing the replayed output may make room, and
// the resident sibling must not be the victim (it would be dropped and then counted resident without memory).
TEST(EngineArenaTest, ReplayOfAMultiOutputOpKeepsItsResidentSibling) {
  ArenaOptions ao;
  ao.capacity = 1024;
  ao.alignment = 64;
  std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), ao);
  std::unique_ptr<Policy> policy = *MakePolicy("lru");
  ArenaExecutor ex(arena.get());
  EngineOptions o;
  o.mode = AccountingMode::kArena;
  o.budget = 1024;
  o.policy = policy.get();
  o.arena = arena.get();
  Engine e(o, &ex);
  arena->SetPressureHandler(&e);
  std::vector<TensorId> in = {*e.Constant(64)};
  std::vector<OutputSpec> two = {{256, -1}, {256, -1}}, one = {{256, -1}};
  std::span<const TensorId> split = *e.Call(in, two, 10, "split");
  const TensorId x = split[0], y = split[1];
  (void)*e.Call(in, one, 10, "z");
  ASSERT_TRUE(e.Evict(e.StorageOf(x)).ok());
  (void)*e.Call(in, one, 10, "w");  // 64 + y + z + w: 192 bytes free, x needs 256; y is the least recently used
  ASSERT_TRUE(e.Rematerialize(x).ok());
  EXPECT_TRUE(e.Resident(e.StorageOf(x)));
  EXPECT_TRUE(e.Resident(e.StorageOf(y)));
  // Every storage the engine counts resident owns a block.
  for (StorageIndex s = 0; s < e.storage_count(); ++s) {
    if (!e.Resident(s)) continue;
    bool owned = false;
    arena->ForEachBlock([&](const BlockInfo& b) { owned = owned || (!b.free && b.owner == OwnerId{s} + 1); });
    EXPECT_TRUE(owned) << "storage " << s << " counted resident without memory";
  }
  arena->SetPressureHandler(nullptr);
}

TEST(EngineSplitTest, BeginEndOpWithArenaPressure) {
  for (const char* name : {"dtr-eq", "coop", "dte"}) {
    ArenaOptions ao;
    ao.capacity = 4096;
    ao.alignment = 64;
    std::unique_ptr<Arena> arena = *Arena::Create(MakeVirtualProvider(), ao);
    std::unique_ptr<Policy> policy = *MakePolicy(name);
    ArenaExecutor ex(arena.get());
    EngineOptions o;
    o.mode = AccountingMode::kArena;
    o.budget = 4096;
    o.policy = policy.get();
    o.arena = arena.get();
    o.replay_views = false;
    Engine e(o, &ex);
    arena->SetPressureHandler(&e);
    // A "kernel": allocate 1024 bytes for the output, owner = the storage index the engine will give it.
    auto run = [&](std::vector<TensorId> in) -> TensorId {
      absl::StatusOr<OpId> op = e.BeginOp(in, "relu");
      EXPECT_TRUE(op.ok()) << op.status();
      StorageIndex next = static_cast<StorageIndex>(e.storage_count());
      absl::StatusOr<std::uintptr_t> a = arena->Allocate(1024, OwnerId{next} + 1);
      EXPECT_TRUE(a.ok()) << name << ": " << a.status();
      OutputSpec out{1024, -1, *a};
      absl::StatusOr<std::span<const TensorId>> outs = e.EndOp(*op, {&out, 1}, 10);
      EXPECT_TRUE(outs.ok()) << outs.status();
      return (*outs)[0];
    };
    TensorId weight = e.AdoptConstant(512, *arena->Allocate(512, OwnerId{e.storage_count()} + 1));
    EXPECT_TRUE(e.Resident(e.StorageOf(weight)));
    std::vector<TensorId> chain = {run({weight})};
    for (int i = 0; i < 7; ++i) chain.push_back(run({chain.back()}));  // 8 x 1 KiB through a 4 KiB arena
    EXPECT_GT(ex.evictions, 0) << name;
    EXPECT_LE(arena->Stats().allocated_bytes, 4096u);
    // Using an evicted early tensor replays it (and what it needs) through the executor.
    run({chain[1]});
    EXPECT_GT(ex.replays, 0) << name;
    EXPECT_GT(e.stats().rematerializations, 0) << name;
    arena->SetPressureHandler(nullptr);
  }
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST(EngineDeadTest, StoragesNothingCanNeedAreFreedForGood) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  RecordingExecutor ex;
  EngineOptions o;
  o.policy = policy.get();
  o.free_dead = true;
  Engine e(o, &ex);
  TensorId a = *e.Constant(10);
  OutputSpec out{100, -1};
  TensorId b = (*e.Call(std::vector<TensorId>{a}, {&out, 1}, 1, "b"))[0];
  TensorId c = (*e.Call(std::vector<TensorId>{b}, {&out, 1}, 1, "c"))[0];
  e.Release(b);  // c may still need b: evicted, not dead
  EXPECT_EQ(e.stats().freed_storages, 0);
  EXPECT_FALSE(e.Resident(e.StorageOf(b)));
  e.Release(c);  // now nothing can need c, nor b
  EXPECT_EQ(e.stats().freed_storages, 2);
  EXPECT_EQ(e.stats().used_bytes, 10);
}

// A pinned result (a gradient the optimizer pinned) whose last reference goes dies like any other once nothing can
// need it; while an unpinned child may still be recomputed from it, it stays.
TEST(EngineDeadTest, APinnedStorageWithNoReferenceLeftDiesToo) {
  std::unique_ptr<Policy> policy = *MakePolicy("dtr-eq");
  RecordingExecutor ex;
  EngineOptions o;
  o.policy = policy.get();
  o.free_dead = true;
  o.free_released_constants = true;  // as remat-sim runs it (the bridge guards released constants itself)
  Engine e(o, &ex);
  TensorId a = *e.Constant(10);
  OutputSpec out{100, -1};
  TensorId g = (*e.Call(std::vector<TensorId>{a}, {&out, 1}, 1, "g"))[0];
  TensorId h = (*e.Call(std::vector<TensorId>{g}, {&out, 1}, 1, "h"))[0];
  e.Pin(g);
  e.Release(g);  // h is not pinned and may need g recomputed: g stays, bytes and all
  EXPECT_FALSE(e.Dead(e.StorageOf(g)));
  EXPECT_TRUE(e.Resident(e.StorageOf(g)));  // a replay of h reads it; it has nothing to be recomputed from
  EXPECT_EQ(e.stats().used_bytes, 210);
  e.Release(h);  // nothing can need h nor g any more
  EXPECT_TRUE(e.Dead(e.StorageOf(h)));
  EXPECT_TRUE(e.Dead(e.StorageOf(g)));
  EXPECT_EQ(e.stats().freed_storages, 2);
  EXPECT_EQ(e.stats().used_bytes, 10);
  EXPECT_FALSE(e.Dead(e.StorageOf(a)));  // still referenced
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// A 1 KiB virtual arena (64-byte alignment) with an engine as its pressure handler.
struct SmallArenaEngine {
  explicit SmallArenaEngine(const char* policy_name)
      : arena(*Arena::Create(MakeVirtualProvider(), SmallArena())),
        policy(*MakePolicy(policy_name)),
        executor(arena.get()),
        engine(Options(policy.get(), arena.get()), &executor) {
    arena->SetPressureHandler(&engine);
  }
  static ArenaOptions SmallArena() {
    ArenaOptions o;
    o.capacity = 1024;
    o.alignment = 64;
    return o;
  }
  static EngineOptions Options(const Policy* policy, Arena* arena) {
    EngineOptions o;
    o.mode = AccountingMode::kArena;
    o.budget = 1024;
    o.policy = policy;
    o.arena = arena;
    return o;
  }
  ~SmallArenaEngine() { arena->SetPressureHandler(nullptr); }
  absl::StatusOr<std::span<const TensorId>> Call(TensorId input, std::int64_t bytes, const char* name) {
    OutputSpec out{bytes, -1};
    return engine.Call(std::vector<TensorId>{input}, {&out, 1}, 1, name);
  }

  std::unique_ptr<Arena> arena;
  std::unique_ptr<Policy> policy;
  ArenaExecutor executor;
  Engine engine;
};

TEST(EngineSplitTest, ArenaOutOfMemoryDuringAReplayNamesTheOpAndTheReplay) {
  SmallArenaEngine f("dtr");
  TensorId a = *f.engine.Constant(256);
  TensorId x = (*f.Call(a, 256, "x"))[0];
  ASSERT_TRUE(f.engine.Evict(f.engine.StorageOf(x)).ok());
  f.engine.Pin((*f.Call(a, 768, "filler"))[0]);  // the arena is full and nothing is evictable
  absl::StatusOr<std::span<const TensorId>> r = f.Call(x, 64, "reader");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr("running 'reader' and replaying 'x' for it (1 replay(s) deep)"));
}

// A result asked back on its own (Engine::Rematerialize: the PyTorch path pins what a parameter update would make
// unreplayable) is no op the program runs: the report says it brings that result back, and names the replay under
// it; before, it said "running 'x'" of a forward op in the middle of an optimizer step.
TEST(EngineSplitTest, ArenaOutOfMemoryBringingAResultBackSaysSo) {
  SmallArenaEngine f("dtr");
  TensorId a = *f.engine.Constant(256);
  TensorId x = (*f.Call(a, 256, "x"))[0];
  TensorId y = (*f.Call(x, 256, "y"))[0];
  ASSERT_TRUE(f.engine.Evict(f.engine.StorageOf(y)).ok());
  ASSERT_TRUE(f.engine.Evict(f.engine.StorageOf(x)).ok());
  f.engine.Pin((*f.Call(a, 768, "filler"))[0]);  // the arena is full and nothing is evictable
  const absl::Status alone = f.engine.Rematerialize(x);
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(std::string(alone.message()), ::testing::HasSubstr(", bringing back a result of 'x',"));
  EXPECT_THAT(std::string(alone.message()), ::testing::Not(::testing::HasSubstr("running '")));
  const absl::Status chained = f.engine.Rematerialize(y);
  ASSERT_FALSE(chained.ok());
  EXPECT_THAT(std::string(chained.message()),
              ::testing::HasSubstr(", bringing back a result of 'y' and replaying 'x' for it (2 replay(s) deep)"));
}

TEST(EngineSplitTest, ArenaOutOfMemoryNamesTheLargestWindow) {
  SmallArenaEngine f("coop");
  TensorId a = *f.engine.Constant(512);
  absl::StatusOr<std::span<const TensorId>> r = f.Call(a, 768, "big");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(r.status()));
  std::string m(r.status().message());
  EXPECT_THAT(m, ::testing::HasSubstr("768"));
  EXPECT_THAT(m, ::testing::HasSubstr("constant 512"));
  EXPECT_THAT(m, ::testing::HasSubstr("largest window of free or evictable blocks 512 bytes"));
  EXPECT_THAT(m, ::testing::HasSubstr("running 'big',"));
  // The engine goes on after a caught OOM: a smaller op fits.
  EXPECT_TRUE(f.Call(a, 256, "small").ok());
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST(EngineInPlaceTest, OldValueBecomesAMemorylessEvictedStorageWithItsProducer) {
  Fixture f("dtr-eq", 1000);
  TensorId a = f.Const("a", 10);
  TensorId b = f.Op("b", {a}, 100, 4);
  std::int64_t used = f.engine->stats().used_bytes;
  TensorId b2 = f.WriteInPlace("add_", {b, a});
  f.Name(b2, "b'");
  EXPECT_NE(f.engine->StorageOf(b2), f.engine->StorageOf(b));
  EXPECT_FALSE(f.engine->Resident(f.engine->StorageOf(b)));  // the old value: no memory, recomputable
  EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(b2)));
  EXPECT_EQ(f.engine->StorageBytes(f.engine->StorageOf(b2)), 100);
  EXPECT_EQ(f.engine->stats().used_bytes, used);  // same bytes, new owner
  EXPECT_EQ(f.engine->stats().evictions, 0);
  // The new value can be evicted and replayed: the old value first (by its producer), then the in-place op.
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(b2)).ok());
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(b2).ok());
  EXPECT_THAT(f.executor.events, ElementsAre("replay b", "replay add_"));
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST(EngineRecoveryTest, FailedCallReleasesItsLocksAndTheEngineGoesOn) {
  Fixture f("dtr-eq", 210);
  TensorId a = f.Const("a", 10);
  TensorId x1 = f.Op("x1", {a}, 100, 1);
  TensorId x2 = f.Op("x2", {x1}, 100, 1);
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x2)).ok());
  ASSERT_TRUE(f.engine->Evict(f.engine->StorageOf(x1)).ok());
  OutputSpec big{150, -1};
  absl::StatusOr<std::span<const TensorId>> r = f.engine->Call(std::vector<TensorId>{x2}, {&big, 1}, 1, "big");
  ASSERT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  // x2 was replayed and locked for "big"; the failure unlocked it, so it is evictable again.
  std::vector<StorageIndex> pool = f.engine->PoolOrder();
  EXPECT_NE(std::find(pool.begin(), pool.end(), f.engine->StorageOf(x2)), pool.end());
  EXPECT_TRUE(f.engine->Defined(x2));
  TensorId y = f.Op("y", {x2}, 50, 1);
  EXPECT_TRUE(f.engine->Defined(y));
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST(EngineInPlaceTest, WritingAConstantInPlaceKeepsAConstant) {
  Fixture f("dtr-eq", 1000);
  TensorId w = f.Const("w", 100);
  TensorId g = f.Op("g", {w}, 100, 4);
  TensorId w2 = f.WriteInPlace("sub_", {w, g});
  EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(w2)));
  EXPECT_FALSE(f.engine->Evict(f.engine->StorageOf(w2)).ok());  // pinned like any constant
  EXPECT_EQ(f.engine->stats().used_bytes, 200);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

TEST(EngineInPlaceTest, ACopyOfTheOldValueMakesItResidentEvictableAndRecomputableAgain) {
  Fixture f("dtr-eq", 1000);
  TensorId a = f.Const("a", 10);
  TensorId b = f.Op("b", {a}, 100, 4);
  f.WriteInPlace("silu_", {b, a});
  const StorageIndex old = f.engine->StorageOf(b);
  const std::int64_t used = f.engine->stats().used_bytes;
  // Autograd's saved original of the in-place write: the old value's bytes, copied outside the engine.
  ASSERT_TRUE(f.engine->AdoptCopy(b, 0).ok());
  EXPECT_TRUE(f.engine->Resident(old));
  EXPECT_TRUE(f.engine->Defined(b));
  EXPECT_EQ(f.engine->stats().used_bytes, used + 100);
  std::vector<StorageIndex> pool = f.engine->PoolOrder();
  EXPECT_NE(std::find(pool.begin(), pool.end(), old), pool.end());  // evictable
  EXPECT_TRUE(absl::IsFailedPrecondition(f.engine->AdoptCopy(b, 0)));  // resident already
  // Evicted, it comes back from its producer as before.
  ASSERT_TRUE(f.engine->Evict(old).ok());
  f.executor.events.clear();
  ASSERT_TRUE(f.engine->Rematerialize(b).ok());
  EXPECT_THAT(f.executor.events, ElementsAre("replay b"));
  // A constant's old value is gone for good: no copy brings it back.
  TensorId w = f.Const("w", 10);
  f.WriteInPlace("mul_", {w});
  EXPECT_TRUE(absl::IsFailedPrecondition(f.engine->AdoptCopy(w, 0)));
}

}  // namespace
}  // namespace remat
