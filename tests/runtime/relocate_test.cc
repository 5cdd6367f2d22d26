// Tests for the engine's relocation (EngineOptions::relocate: Executor::Relocate, compaction with Executor::Slide,
// Engine::MakeHoleForRetry) in arena mode, and for what Engine::Hold keeps in place, through the simulator's executor.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "allocator/arena.h"
#include "allocator/memory_provider.h"
#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/engine.h"
#include "runtime/sim_executor.h"

namespace remat {
namespace {

// An engine (dtr-eq) over a fresh 1024-byte arena (64-byte units) with nothing in it. Compacting first
// (EngineOptions::compact_first_limit) is off unless asked for: most tests here pin the last resort's steps.
struct Empty {
  explicit Empty(bool relocate = true, std::size_t compact_first_limit = 0) {
    arena = *Arena::Create(MakeVirtualProvider(), ArenaOptions{.capacity = 1024, .alignment = 64});
    policy = *MakePolicy("dtr-eq");
    executor = std::make_unique<SimExecutor>(arena.get(), /*cheap_tensor_partitioning=*/false);
    EngineOptions o;
    o.mode = AccountingMode::kArena;
    o.budget = 1024;
    o.policy = policy.get();
    o.arena = arena.get();
    o.relocate = relocate;
    o.compact_first_limit = compact_first_limit;
    engine = std::make_unique<Engine>(o, executor.get());
    arena->SetPressureHandler(engine.get());
    arena->ForEachBlock([&](const BlockInfo& block) { base = base == 0 ? block.address : base; });
  }
  ~Empty() { arena->SetPressureHandler(nullptr); }
  std::uintptr_t AddressOf(TensorId t) const { return engine->StorageAddress(engine->StorageOf(t)); }

  std::unique_ptr<Arena> arena;
  std::unique_ptr<Policy> policy;
  std::unique_ptr<SimExecutor> executor;
  std::unique_ptr<Engine> engine;
  std::uintptr_t base = 0;
};

// Constants c0..c3 of 64 bytes between three 192-byte activations, then the activations are released. Free: four
// 192-byte holes and 768 bytes in all; a 384-byte request has no hole unless a constant moves.
struct Fragmented : Empty {
  explicit Fragmented(bool relocate) : Empty(relocate) {
    const std::vector<OutputSpec> activation = {{192, -1}};
    c.push_back(*engine->Constant(64));
    for (int i = 0; i < 3; ++i) {
      const std::vector<TensorId> in = {c[0]};
      activations.push_back((*engine->Call(in, activation, 10, "act"))[0]);
      c.push_back(*engine->Constant(64));
    }
    for (TensorId t : activations) engine->Release(t);
  }
  std::vector<TensorId> c;
  std::vector<TensorId> activations;
};

TEST(RelocateTest, TheLayoutLeavesFreeBytesButNoHole) {
  Fragmented f(/*relocate=*/false);
  EXPECT_EQ(f.arena->Stats().free_bytes, 768u);
  EXPECT_EQ(f.arena->Stats().largest_free_block, 192u);
  const std::vector<TensorId> in = {f.c[0]};
  const std::vector<OutputSpec> big = {{384, -1}};
  auto result = f.engine->Call(in, big, 10, "big");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  // The report says what holds the memory: four 64-byte constants, all in the arena; nothing pinned by results.
  EXPECT_NE(std::string(result.status().message()).find("constant 256 of which 256 in the arena, pinned results 0"),
            std::string::npos)
      << result.status().message();
  EXPECT_EQ(f.engine->stats().relocations, 0);
}

TEST(RelocateTest, MovingOneConstantOutOfTheCheapestWindowMakesTheHole) {
  Fragmented f(/*relocate=*/true);
  const std::uintptr_t base = f.engine->StorageAddress(f.engine->StorageOf(f.c[0]));
  // c1 sits at 256, between the first two holes: the window [64, 512) needs only it moved (ties: lowest window).
  ASSERT_EQ(f.engine->StorageAddress(f.engine->StorageOf(f.c[1])), base + 256);
  const std::vector<TensorId> in = {f.c[0]};
  const std::vector<OutputSpec> big = {{384, -1}};
  auto result = f.engine->Call(in, big, 10, "big");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(f.engine->stats().relocations, 1);
  EXPECT_EQ(f.engine->stats().relocated_bytes, 64);
  // c1 went to the highest hole (the top of [832, 1024)); the request took the 448 bytes it freed.
  EXPECT_EQ(f.engine->StorageAddress(f.engine->StorageOf(f.c[1])), base + 960);
  EXPECT_EQ(f.engine->StorageAddress(f.engine->StorageOf((*result)[0])), base + 64);
  // c0 is the running op's input (locked): it never moves.
  EXPECT_EQ(f.engine->StorageAddress(f.engine->StorageOf(f.c[0])), base);
  EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(f.c[1])));
}

// Inputs an op has locked while it replays another input are not in use by any kernel yet: they may move. Layout
// (64-byte units): c0 [0,64), then three 64-byte inputs a0..a2 of the op after 192-byte holes; b (384 bytes) was
// evicted and must be replayed before the op runs. No constant but c0 (the replay's own input) could move, so only
// moving a locked input makes the 384-byte hole.
TEST(RelocateTest, InputsLockedWhileAnotherInputReplaysMayMove) {
  Empty e;
  Engine& engine = *e.engine;
  const TensorId c0 = *engine.Constant(64);
  const std::vector<TensorId> from_c0 = {c0};
  const std::vector<OutputSpec> spec192 = {{192, -1}}, spec64 = {{64, -1}}, spec384 = {{384, -1}};
  const TensorId b = (*engine.Call(from_c0, spec384, 10, "b"))[0];
  ASSERT_TRUE(engine.Evict(engine.StorageOf(b)).ok());
  std::vector<TensorId> holes, inputs;
  for (int i = 0; i < 3; ++i) {
    holes.push_back((*engine.Call(from_c0, spec192, 10, "act"))[0]);
    inputs.push_back((*engine.Call(from_c0, spec64, 10, "a"))[0]);
  }
  for (TensorId t : holes) engine.Release(t);
  ASSERT_EQ(e.AddressOf(inputs[0]), e.base + 256);
  ASSERT_EQ(e.arena->Stats().largest_free_block, 192u);
  const std::int64_t evictions_before = engine.stats().evictions;

  std::vector<TensorId> op_inputs = inputs;
  op_inputs.push_back(b);
  auto result = engine.Call(op_inputs, spec64, 10, "op");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(engine.stats().relocations, 1);
  EXPECT_EQ(engine.stats().evictions, evictions_before);  // nothing was evictable: the rest are the op's inputs
  EXPECT_EQ(e.AddressOf(b), e.base + 64);
  EXPECT_EQ(e.AddressOf(inputs[0]), e.base + 960);  // the highest hole
  EXPECT_EQ(e.AddressOf(c0), e.base);  // the replay's input never moves
}

// Holes of 64 and 192 bytes around a 256-byte constant: moving it out needs a hole of 256 that does not exist, but
// sliding it down joins the holes. Layout: c0 [0,64), hole [64,128), c1 [128,384), hole [384,576), c2 [576,1024).
// Compacting first: c0, then six 128-byte activations and a 64-byte constant fill 896 bytes; with a1 and a3 released,
// 384 bytes are free in three 128-byte holes. A 256-byte request slides a2 (128 bytes, within twice the request)
// onto a1's hole and evicts nothing; evicting first, the policy evicts until a hole forms.
struct ActivationsBetweenHoles : Empty {
  explicit ActivationsBetweenHoles(std::size_t compact_first_limit) : Empty(true, compact_first_limit) {
    c0 = *engine->Constant(64);
    const std::vector<TensorId> from_c0 = {c0};
    const std::vector<OutputSpec> spec128 = {{128, -1}};
    for (int i = 0; i < 6; ++i) a.push_back((*engine->Call(from_c0, spec128, 10, "act"))[0]);
    (void)*engine->Constant(64);
    engine->Release(a[1]);
    engine->Release(a[3]);
  }
  absl::StatusOr<std::span<const TensorId>> Request() {
    const std::vector<TensorId> in = {c0};
    const std::vector<OutputSpec> spec256 = {{256, -1}};
    return engine->Call(in, spec256, 10, "big");
  }
  TensorId c0 = 0;
  std::vector<TensorId> a;
};

TEST(RelocateTest, CompactingFirstSlidesInsteadOfEvicting) {
  ActivationsBetweenHoles f(/*compact_first_limit=*/2);
  ASSERT_EQ(f.arena->Stats().free_bytes, 384u);
  ASSERT_EQ(f.arena->Stats().largest_free_block, 128u);
  auto result = f.Request();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(f.engine->stats().evictions, 0);
  EXPECT_EQ(f.engine->stats().compactions, 1);
  EXPECT_EQ(f.engine->stats().compacted_bytes, 128);
  for (int i : {0, 2, 4, 5}) EXPECT_TRUE(f.engine->Resident(f.engine->StorageOf(f.a[i]))) << "a" << i;
}

TEST(RelocateTest, EvictingFirstEvictsUntilAHoleForms) {
  ActivationsBetweenHoles f(/*compact_first_limit=*/0);
  auto result = f.Request();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GE(f.engine->stats().evictions, 1);
  EXPECT_EQ(f.engine->stats().compactions, 0);
}

TEST(RelocateTest, CompactionSlidesWhatNoHoleCanTake) {
  Empty e;
  const TensorId c0 = *e.engine->Constant(64);
  const std::vector<TensorId> from_c0 = {c0};
  const std::vector<OutputSpec> spec64 = {{64, -1}}, spec192 = {{192, -1}}, spec256 = {{256, -1}};
  const TensorId a = (*e.engine->Call(from_c0, spec64, 10, "a"))[0];
  const TensorId c1 = *e.engine->Constant(256);
  const TensorId b = (*e.engine->Call(from_c0, spec192, 10, "b"))[0];
  const TensorId c2 = *e.engine->Constant(448);
  e.engine->Release(a);
  e.engine->Release(b);
  ASSERT_EQ(e.AddressOf(c1), e.base + 128);
  ASSERT_EQ(e.arena->Stats().largest_free_block, 192u);
  auto result = e.engine->Call(from_c0, spec256, 10, "big");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(e.engine->stats().relocations, 0);  // no hole outside a window could take c1
  EXPECT_EQ(e.engine->stats().compactions, 1);
  EXPECT_EQ(e.engine->stats().compacted_bytes, 256);
  EXPECT_EQ(e.AddressOf(c1), e.base + 64);  // slid down onto the first hole
  EXPECT_EQ(e.AddressOf((*result)[0]), e.base + 320);
  EXPECT_EQ(e.AddressOf(c2), e.base + 576);  // outside the run: not moved
}

// A 64-byte constant, then x (64 bytes) with free holes of 64 and 832 bytes on either side.
struct InputBetweenHoles : Empty {
  InputBetweenHoles() {
    const TensorId c0 = *engine->Constant(64);
    const std::vector<TensorId> from_c0 = {c0};
    const std::vector<OutputSpec> spec64 = {{64, -1}}, spec832 = {{832, -1}};
    const TensorId a = (*engine->Call(from_c0, spec64, 10, "a"))[0];
    x = (*engine->Call(from_c0, spec64, 10, "x"))[0];
    const TensorId b = (*engine->Call(from_c0, spec832, 10, "b"))[0];
    engine->Release(a);
    engine->Release(b);
    EXPECT_EQ(AddressOf(x), base + 128);
  }
  TensorId x = 0;
};

// The caller's own kernel (between BeginOp and EndOp) needs 128 bytes while its input splits the free bytes: no
// storage may move while the kernel uses the input, so MakeRoom gives up; once the kernel has failed, the input
// may move and MakeHoleForRetry makes the hole.
TEST(RelocateTest, AFailedKernelsInputsMoveForItsRetry) {
  InputBetweenHoles e;
  const TensorId x = e.x;
  EXPECT_FALSE(*e.engine->MakeHoleForRetry());  // nothing has failed yet
  const std::vector<TensorId> from_x = {x};
  absl::StatusOr<OpId> op = e.engine->BeginOp(from_x, "kernel");
  ASSERT_TRUE(op.ok()) << op.status();
  absl::StatusOr<std::uintptr_t> first = e.arena->Allocate(896, OwnerId{0});
  ASSERT_FALSE(first.ok());  // x is in use: it cannot move
  EXPECT_EQ(e.AddressOf(x), e.base + 128);
  ASSERT_TRUE(*e.engine->MakeHoleForRetry());
  EXPECT_EQ(e.AddressOf(x), e.base + 64);
  EXPECT_EQ(e.engine->stats().compactions, 1);
  absl::StatusOr<std::uintptr_t> second = e.arena->Allocate(896, OwnerId{0});
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<OutputSpec> out = {{896, -1, *second}};
  ASSERT_TRUE(e.engine->EndOp(*op, out, 10).ok());
  EXPECT_FALSE(*e.engine->MakeHoleForRetry());  // the request it was for is served
}

// The same kernel inside a composite op that holds x (Engine::Hold): x cannot move for the kernel's retry either,
// so MakeHoleForRetry makes no hole and keeps the request; once the composite has unwound and let x go, asking again
// makes the hole the failed allocation needed (the composite runs again: dispatch_hook.h,
// RetryCompositeAfterOutOfMemory).
TEST(RelocateTest, AHeldInputKeepsTheRequestForTheRetryOfWhatHoldsIt) {
  InputBetweenHoles e;
  const TensorId x = e.x;
  ASSERT_TRUE(e.engine->Hold(x).ok());
  const std::vector<TensorId> from_x = {x};
  absl::StatusOr<OpId> op = e.engine->BeginOp(from_x, "kernel");
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_FALSE(e.arena->Allocate(896, OwnerId{0}).ok());
  e.engine->AbortOp(*op);
  EXPECT_FALSE(*e.engine->MakeHoleForRetry());  // x is held: no hole
  EXPECT_EQ(e.AddressOf(x), e.base + 128);
  e.engine->Unhold(x);
  ASSERT_TRUE(*e.engine->MakeHoleForRetry());  // the same request, asked again
  EXPECT_EQ(e.AddressOf(x), e.base + 64);
  EXPECT_TRUE(e.arena->Allocate(896, OwnerId{0}).ok());
  EXPECT_FALSE(*e.engine->MakeHoleForRetry());  // served
}

// Held storages (Engine::Hold: a composite kernel reads them through raw pointers) stay where they are: with c1, c2
// and c3 held, no window of Fragmented's layout holds 384 bytes without moving one, and compaction may not slide
// them either. Once let go, the same request moves one.
TEST(RelocateTest, HeldStoragesAreNeitherRelocatedNorSlid) {
  Fragmented f(/*relocate=*/true);
  std::vector<std::uintptr_t> before;
  for (TensorId t : f.c) before.push_back(f.AddressOf(t));
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(f.engine->Hold(f.c[i]).ok());
  const std::vector<TensorId> in = {f.c[0]};
  const std::vector<OutputSpec> big = {{384, -1}};
  auto result = f.engine->Call(in, big, 10, "big");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(f.engine->stats().relocations, 0);
  for (std::size_t i = 0; i < f.c.size(); ++i) EXPECT_EQ(f.AddressOf(f.c[i]), before[i]) << "c" << i;
  for (int i = 1; i <= 3; ++i) f.engine->Unhold(f.c[i]);
  result = f.engine->Call(in, big, 10, "big");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(f.engine->stats().relocations, 1);
}

// Hold brings an evicted storage back, and a held storage is not evicted to make room; Unhold makes it evictable
// again. 448-byte activations: c0 and two of them fill 960 of the 1024 bytes.
TEST(RelocateTest, HoldBringsBackAndKeepsAnEvictableStorage) {
  Empty e;
  Engine& engine = *e.engine;
  const TensorId c0 = *engine.Constant(64);
  const std::vector<TensorId> from_c0 = {c0};
  const std::vector<OutputSpec> spec448 = {{448, -1}};
  const TensorId a = (*engine.Call(from_c0, spec448, 10, "a"))[0];
  ASSERT_TRUE(engine.Evict(engine.StorageOf(a)).ok());
  ASSERT_TRUE(engine.Hold(a).ok());
  EXPECT_TRUE(engine.Resident(engine.StorageOf(a)));
  const TensorId b = (*engine.Call(from_c0, spec448, 10, "b"))[0];
  auto c = engine.Call(from_c0, spec448, 10, "c");  // b makes room, not a
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(engine.Resident(engine.StorageOf(b)));
  EXPECT_TRUE(engine.Resident(engine.StorageOf(a)));
  const std::vector<TensorId> from_c = {c0, (*c)[0]};  // c is locked as an input: only a could make room
  EXPECT_FALSE(engine.Call(from_c, spec448, 10, "d").ok());
  EXPECT_TRUE(engine.Resident(engine.StorageOf(a)));
  engine.Unhold(a);
  auto d = engine.Call(from_c, spec448, 10, "d");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(engine.Resident(engine.StorageOf(a)));
}

}  // namespace
}  // namespace remat
