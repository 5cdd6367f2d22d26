// Recycling (runtime/engine.h, "Recycling"): over a long training-like run under a binding budget, the engine's
// tables stop growing once what is live stops growing, and recycled slots never change a value: every replay
// reproduces its first execution, and the first executions are those of an unconstrained run.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/registry.h"
#include "runtime/engine.h"
#include "tests/runtime/value_hash.h"

namespace remat {
namespace {

// Each output's value is a hash of the op's name and its inputs' values, so it names no id: a recycled id that
// reached a replay would show as a different value.
class ValueExecutor : public Executor {
 public:
  absl::Status Execute(Engine& e, OpId op, bool replay, std::span<const std::uint32_t>) override {
    std::uint64_t h = std::hash<std::string_view>()(e.OpName(op));
    for (TensorId in : e.OpInputs(op)) {
      const StorageIndex s = e.StorageOf(in);
      if (!e.Resident(s) || s >= value_.size() || !value_[s]) {
        ADD_FAILURE() << "'" << e.OpName(op) << "' reads a storage that is not resident";
        return absl::InternalError("input not resident");
      }
      h = Mix(h, *value_[s]);
    }
    std::span<const TensorId> outs = e.OpOutputs(op);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const StorageIndex s = e.StorageOf(outs[i]);
      if (value_.size() <= s) {
        value_.resize(s + 1);
        first_.resize(s + 1);
      }
      const std::uint64_t v = Mix(h, i);
      value_[s] = v;
      if (!replay) {
        first_[s] = v;
        sequence.push_back(v);
      } else if (first_[s] != v) {
        ADD_FAILURE() << "replay of '" << e.OpName(op) << "' gave another value than its first execution";
      }
    }
    return absl::OkStatus();
  }
  void Evict(Engine&, std::uint32_t s) override { value_[s].reset(); }
  // An in-place write (EndOp): the new value lands in the input's bytes.
  void Write(StorageIndex s, std::uint64_t v) {
    if (value_.size() <= s) {
      value_.resize(s + 1);
      first_.resize(s + 1);
    }
    value_[s] = first_[s] = v;
    sequence.push_back(v);
  }
  std::uint64_t Value(StorageIndex s) const { return *value_[s]; }
  std::vector<std::uint64_t> sequence;  // values of first executions, in order

 private:
  std::vector<std::optional<std::uint64_t>> value_;
  std::vector<std::uint64_t> first_;
};

struct TrainingRun {
  std::vector<std::uint64_t> sequence;
  EngineStats stats;
  std::vector<EngineTables> tables;  // after each step
};

// `steps` steps of an L-layer MLP as the PyTorch bridge drives the engine: weights are constants updated in place
// by the optimizer, activations are released after the backward pass, gradients pinned by the first write to them
// and released after the update; CollectDead and Recycle between any two ops (the bridge prunes every 1024 ops,
// wherever in a step that falls), so that what is still needed mid-step is there to be broken.
TrainingRun Train(std::int64_t budget, int steps, const std::string& policy_name) {
  constexpr int kLayers = 8;
  constexpr std::int64_t kActivation = 1000, kWeight = 100;
  std::unique_ptr<Policy> policy = *MakePolicy(policy_name);
  ValueExecutor ex;
  EngineOptions o;
  o.policy = policy.get();
  o.budget = budget;
  o.free_dead = true;
  o.free_released_constants = true;
  Engine e(o, &ex);
  TrainingRun run;
  std::vector<TensorId> w(kLayers);
  for (int i = 0; i < kLayers; ++i) w[i] = *e.Constant(kWeight, "w" + std::to_string(i));
  const OutputSpec activation{kActivation, -1}, weight{kWeight, -1}, scalar{8, -1};
  auto call = [&](std::vector<TensorId> in, const OutputSpec& out, const std::string& name) {
    absl::StatusOr<std::span<const TensorId>> r = e.Call(in, {&out, 1}, 10, name);
    EXPECT_TRUE(r.ok()) << r.status();
    const TensorId t = (*r)[0];
    e.CollectDead();
    e.Recycle();
    return t;
  };
  for (int step = 0; step < steps; ++step) {
    const TensorId x = *e.Constant(kActivation, "x");
    std::vector<TensorId> h = {x};
    for (int i = 0; i < kLayers; ++i) h.push_back(call({h[i], w[i]}, activation, "layer" + std::to_string(i)));
    const TensorId loss = call({h[kLayers]}, scalar, "loss");
    TensorId g = call({loss, h[kLayers]}, activation, "loss_backward");
    std::vector<TensorId> grads(kLayers);
    for (int i = kLayers - 1; i >= 0; --i) {
      grads[i] = call({g, h[i]}, weight, "grad_w" + std::to_string(i));
      const TensorId next = call({g, w[i]}, activation, "grad_x" + std::to_string(i));
      e.Release(g);
      e.Release(h[i + 1]);
      g = next;
    }
    e.Release(g);
    e.Release(loss);
    e.Release(x);
    for (int i = 0; i < kLayers; ++i) {
      e.Pin(grads[i]);  // the optimizer's first write pins a gradient
      const TensorId inputs[] = {w[i], grads[i]};
      absl::StatusOr<OpId> op = e.BeginOp(inputs, "sgd_step");
      EXPECT_TRUE(op.ok()) << op.status();
      const StorageIndex ws = e.StorageOf(w[i]);
      const std::uint64_t updated = Mix(ex.Value(ws), ex.Value(e.StorageOf(grads[i])));
      OutputSpec write;
      write.in_place_of = 0;
      const TensorId neww = (*e.EndOp(*op, {&write, 1}, 5))[0];
      ex.Write(e.StorageOf(neww), updated);
      e.Release(w[i]);
      w[i] = neww;
      e.Release(grads[i]);
      e.CollectDead();
      e.Recycle();
    }
    e.CollectDead();
    e.Recycle();
    run.tables.push_back(e.tables());
  }
  run.sequence = ex.sequence;
  run.stats = e.stats();
  return run;
}

TEST(EngineRecycleTest, TablesStayBoundedOverTwoThousandStepsAndValuesAreUnchanged) {
  constexpr int kSteps = 2000, kWarmup = 20;
  const TrainingRun free = Train(std::int64_t{1} << 40, kSteps, "dtr-eq");
  // About half of what the activations of one step need.
  const TrainingRun tight = Train(5800, kSteps, "dtr-eq");
  EXPECT_GT(tight.stats.evictions, kSteps);
  EXPECT_GT(tight.stats.rematerializations, kSteps);
  EXPECT_GT(tight.stats.recycled_storages, 20 * kSteps);
  EXPECT_EQ(free.sequence, tight.sequence);  // same first executions as the unconstrained run
  for (const TrainingRun* run : {&free, &tight}) {
    EngineTables bound{};
    for (int step = 0; step < kWarmup; ++step) {
      bound.op_slots = std::max(bound.op_slots, run->tables[step].op_slots);
      bound.tensor_slots = std::max(bound.tensor_slots, run->tables[step].tensor_slots);
      bound.storage_slots = std::max(bound.storage_slots, run->tables[step].storage_slots);
    }
    for (int step = kWarmup; step < kSteps; ++step) {
      const EngineTables& t = run->tables[step];
      ASSERT_LE(t.op_slots, bound.op_slots) << "step " << step;
      ASSERT_LE(t.tensor_slots, bound.tensor_slots) << "step " << step;
      ASSERT_LE(t.storage_slots, bound.storage_slots) << "step " << step;
      // Compacted once their garbage outnumbers what is used (and past a floor of 4096).
      ASSERT_LE(t.op_io_entries, 2 * std::max<std::size_t>(4096, 4 * t.op_slots)) << "step " << step;
      ASSERT_LE(t.union_find_nodes, 2 * std::max<std::size_t>(4096, 2 * t.storage_slots)) << "step " << step;
    }
  }
  // Without recycling (the same run, no Recycle calls) the tables would hold every op of every step.
  EXPECT_LT(tight.tables.back().op_slots, 2000u);
}

// The same with a policy that keeps regions (h_DTR): recycled storages leave the walks.
TEST(EngineRecycleTest, RegionsPolicyReplaysTheSameValues) {
  const TrainingRun free = Train(std::int64_t{1} << 40, 300, "dtr");
  const TrainingRun tight = Train(5800, 300, "dtr");
  EXPECT_GT(tight.stats.rematerializations, 300);
  EXPECT_EQ(free.sequence, tight.sequence);
  EXPECT_LE(tight.tables.back().storage_slots, tight.tables[20].storage_slots);
}

// An engine (dtr-eq, freeing dead storages) over a ValueExecutor.
struct FreeDeadEngine {
  FreeDeadEngine() : policy(*MakePolicy("dtr-eq")), e(Options(policy.get()), &ex) {}
  static EngineOptions Options(Policy* policy) {
    EngineOptions o;
    o.policy = policy;
    o.free_dead = true;
    return o;
  }
  std::unique_ptr<Policy> policy;
  ValueExecutor ex;
  Engine e;
};

// A replay of a two-output op for its live output does not bring the dead one back (nothing needs it, and a slot
// that held memory could not be recycled); the op and both storages are recycled once the live one dies too.
TEST(EngineRecycleTest, AReplayLeavesADeadSiblingOutAndEverythingIsRecycledAfter) {
  FreeDeadEngine f;
  Engine& e = f.e;
  const TensorId x = *e.Constant(10, "x");
  const OutputSpec outs[] = {{100, -1}, {1000, -1}};
  absl::StatusOr<std::span<const TensorId>> r = e.Call(std::vector<TensorId>{x}, outs, 5, "split");
  ASSERT_TRUE(r.ok());
  const TensorId kept = (*r)[0], dropped = (*r)[1];
  e.Release(dropped);
  ASSERT_TRUE(e.Dead(e.StorageOf(dropped)));
  ASSERT_TRUE(e.Evict(e.StorageOf(kept)).ok());
  ASSERT_TRUE(e.Rematerialize(kept).ok());
  EXPECT_TRUE(e.Resident(e.StorageOf(kept)));
  EXPECT_FALSE(e.Resident(e.StorageOf(dropped)));
  EXPECT_EQ(e.stats().used_bytes, 10 + 100);  // the constant and the live output, not the dead one
  EXPECT_TRUE(e.Recycle().ops.empty());        // the op may still replay `kept`
  e.Release(kept);
  // An op the caller still keeps something under (a record) waits: nothing is freed, and it is tried again later.
  EXPECT_TRUE(e.Recycle([](OpId) { return true; }).ops.empty());
  const RecycledIds freed = e.Recycle();
  EXPECT_EQ(freed.ops.size(), 1u);
  EXPECT_EQ(freed.storages.size(), 2u);
  EXPECT_EQ(e.stats().used_bytes, 10);
}

// A held storage (Engine::Hold) whose value dies while held (a pinned result written in place: the old value leaves
// the graph) keeps its slot until Unhold, which names it: recycling it first would let Unhold unlock another storage.
TEST(EngineRecycleTest, AHeldStorageThatDiesKeepsItsSlotUntilUnhold) {
  FreeDeadEngine f;
  Engine& e = f.e;
  const TensorId x = *e.Constant(10, "x");
  const OutputSpec out[] = {{100, -1}};
  const TensorId g = (*e.Call(std::vector<TensorId>{x}, out, 5, "grad"))[0];
  e.Pin(g);  // a pinned result (an optimizer's first write pins a gradient)
  ASSERT_TRUE(e.Hold(g).ok());
  const TensorId inputs[] = {g, x};
  absl::StatusOr<OpId> op = e.BeginOp(inputs, "scale_");
  ASSERT_TRUE(op.ok()) << op.status();
  OutputSpec write;
  write.in_place_of = 0;
  const TensorId new_g = (*e.EndOp(*op, {&write, 1}, 5))[0];
  e.Release(g);
  ASSERT_TRUE(e.Dead(e.StorageOf(g)));
  e.CollectDead();
  EXPECT_TRUE(e.Recycle().storages.empty());  // without the hold, it would be freed here
  e.Unhold(g);
  const RecycledIds after = e.Recycle();
  EXPECT_EQ(after.storages.size(), 1u);
  EXPECT_TRUE(e.Resident(e.StorageOf(new_g)));
}

}  // namespace
}  // namespace remat
