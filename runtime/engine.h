// Engine: dynamic tensor rematerialization over a graph of ops, tensors and storages (DESIGN.md, "runtime/").
//
// Model. An op consumes input tensors and produces output tensors. A tensor is either the root of a fresh storage
// or a view (alias) of an input's storage; views add no bytes, and a view op's cost adds to its base storage's cost
// (a storage's cost c = sum over the distinct ops that produced its tensors). The storage is the unit of
// eviction. Constants (no producer) are pinned: never evicted.
//
// Semantics (match the DTR prototype simulator, ../shared/traces/dtr/README.md):
//   - The clock starts at 1 and advances by each executed op's cost, replays included.
//   - Running an op: every input storage gets last access = clock; inputs already defined are locked; evicted
//     inputs are rematerialized one after another (an explicit work stack: no C++ recursion, so a 100,000-op chain
//     works) and locked; then memory is made for the outputs (counter mode: while used + outputs > budget, evict
//     the policy's choice; arena mode: the executor allocates and the arena calls MakeRoom), the executor runs the
//     op, the inputs are unlocked. Fresh outputs get last access = clock after the op.
//   - Multi-output ops are recomputed as a whole; outputs that were still resident are counted and subtracted again
//     (counter mode), as in the prototype.
//   - With `replay_views` (the prototype's model) a view tensor becomes undefined when its storage is evicted, and
//     using it again replays its view op (cost counts); without it views come back with their storage.
//   - Releasing the last external reference of a storage evicts it at once; it stays in the graph, recomputable.
//   - Thrash: once the summed cost of replays exceeds `remat_limit` (>= 0), the running call fails with Aborted.
//   - No memory: the call fails with ResourceExhausted naming requested, budget, used, locked and constant bytes
//     and (arena) the largest window. A failed call releases the locks it took and leaves the engine usable: what
//     it replayed stays resident, the failed op's outputs stay unproduced (a later use replays them).
//
// Policies are consulted through a read-only StorageView; the engine maintains the incremental structures a policy
// asks for (PolicyFeatures): forward/backward evicted regions (e*) and union-find classes of evicted storages.
// Not thread-safe: one engine per thread (PyTorch ops on one device are serialized by the integration).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "policies/policy.h"
#include "runtime/executor.h"

namespace remat {

enum class AccountingMode { kCounter, kArena };

struct EngineOptions {
  AccountingMode mode = AccountingMode::kCounter;
  std::int64_t budget = std::numeric_limits<std::int64_t>::max();
  const Policy* policy = nullptr;          // required; not owned
  ChooseOptions choose;                    // sqrt(n) sampling, ignore small storages
  std::uint64_t seed = 0;                  // random policy and sampling
  std::int64_t remat_limit = -1;           // thrash limit on summed replay cost; < 0 disables
  bool replay_views = true;                // see the contract above
  bool free_released_constants = false;    // a constant whose last reference dies is freed (baseline runs)
  // Free storages for good once nothing can need them (no reference, every storage computed from them dead):
  // they leave the neighbourhood costs. Off in the prototype's model (simrd keeps them forever).
  bool free_dead = false;
  Arena* arena = nullptr;                  // arena mode: the arena the executor allocates from (for windows, stats)
};

struct OutputSpec {
  std::int64_t bytes = 0;        // ignored for views
  std::int32_t alias = -1;       // -1: fresh storage; k: a view of inputs[k]'s storage
  std::uintptr_t address = 0;    // EndOp only: where the kernel put it (0 = unknown)
  // EndOp only: the kernel wrote input k in place. The output is a fresh storage (new value) that takes over the
  // input storage's bytes and address; the input's storage becomes the old value, memory-less and evicted, still
  // recomputable by its producer (DESIGN.md "Recomputable in-place"). bytes/address are taken from the input.
  // Writing a constant in place (optimizer step) makes the new value a constant and drops the old one for good.
  std::int32_t in_place_of = -1;
};

struct EngineStats {
  std::int64_t clock = 1;
  std::int64_t model_compute = 0;      // cost of first executions
  std::int64_t remat_compute = 0;      // cost of replays
  std::int64_t evictions = 0;          // by the policy (pressure)
  std::int64_t release_evictions = 0;  // because the last external reference died
  std::int64_t freed_storages = 0;     // free_dead: storages out of the graph for good
  std::int64_t rematerializations = 0; // ops replayed
  std::int64_t heuristic_evaluations = 0;
  std::int64_t search_ns = 0;
  std::int64_t peak_bytes = 0;         // counter: peak bytes in use (prototype's max_memory); arena: peak allocated
  std::int64_t used_bytes = 0;
  double fragmentation_sum = 0;        // arena: sum over pressured allocations of free bytes / budget
  std::int64_t fragmentation_samples = 0;
};

using StorageIndex = std::uint32_t;

class Engine final : public PressureHandler, private StorageView {
 public:
  Engine(EngineOptions options, Executor* executor);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A constant (weight, input): computed at cost 0, then pinned.
  absl::StatusOr<TensorId> Constant(std::int64_t bytes, std::string_view name = "constant");
  // A constant that already exists in memory (a parameter, an input the caller allocated): registered resident and
  // pinned without running anything.
  TensorId AdoptConstant(std::int64_t bytes, std::uintptr_t address, std::string_view name = "constant");
  // Runs an op on `inputs`; returns its output tensors (valid until the next call). Each output starts with one
  // external reference.
  absl::StatusOr<std::span<const TensorId>> Call(std::span<const TensorId> inputs,
                                                 std::span<const OutputSpec> outputs, std::int64_t cost,
                                                 std::string_view name);
  // The same op split in two, for callers that run the kernel themselves (PyTorch): BeginOp makes the inputs
  // resident (replaying what it must) and locks them; the caller runs the kernel, whose allocations may call
  // MakeRoom through the arena; EndOp registers the outputs (bytes, alias, address) as resident with the measured
  // cost and unlocks the inputs. AbortOp unlocks the inputs of an op whose kernel failed. Replays of the op later go
  // through Executor::Execute. One op at a time: EndOp must close the latest BeginOp.
  absl::StatusOr<OpId> BeginOp(std::span<const TensorId> inputs, std::string_view name);
  absl::StatusOr<std::span<const TensorId>> EndOp(OpId op, std::span<const OutputSpec> outputs, std::int64_t cost);
  void AbortOp(OpId op);
  // One more / one fewer external reference to a tensor. Releasing the last reference of a storage evicts it.
  void Retain(TensorId t);
  void Release(TensorId t);
  // Makes `t` resident (replaying what it needs); counts as replay cost.
  absl::Status Rematerialize(TensorId t);
  // Locks t's storage for good (outputs at the end of a replay).
  void Pin(TensorId t);

  // Reported by the executor in arena mode: where storage s lives.
  void SetAddress(StorageIndex s, std::uintptr_t address);
  // The executor calls this before each arena allocation so pressure is sampled once per allocation.
  void NoteAllocation() { pressure_sampled_ = false; }

  // PressureHandler (arena mode): evicts one storage, or one window for window policies.
  bool MakeRoom(Arena& arena, std::size_t bytes) override;

  // Introspection (tests, executors, integration).
  const EngineStats& stats() const { return stats_; }
  std::int64_t clock() const { return stats_.clock; }
  bool Defined(TensorId t) const;
  StorageIndex StorageOf(TensorId t) const;
  TensorId StorageRoot(StorageIndex s) const;  // the tensor that created the storage
  bool Resident(StorageIndex s) const;
  std::int64_t StorageBytes(StorageIndex s) const;
  std::uintptr_t StorageAddress(StorageIndex s) const;
  std::int64_t ExternalRefs(TensorId t) const;
  OpId ProducerOf(TensorId t) const;
  std::span<const TensorId> OpInputs(OpId op) const;
  std::span<const TensorId> OpOutputs(OpId op) const;
  std::string_view OpName(OpId op) const;
  bool OpCostly(OpId op) const;
  std::int64_t OpCost(OpId op) const;
  std::size_t storage_count() const;
  std::size_t tensor_count() const;
  // Evicts a specific storage now (tests, integration); it must be evictable.
  absl::Status Evict(StorageIndex s);
  // The read-only view the policies score (benchmarks, tests, custom drivers).
  const StorageView& view() const { return *this; }
  // Storages in eviction-pool order (resident, unlocked, not constant).
  std::vector<StorageIndex> PoolOrder() const;

 private:
  struct Impl;
  // StorageView
  std::int64_t Clock() const override;
  std::int64_t Bytes(StorageId s) const override;
  std::int64_t Compute(StorageId s) const override;
  std::int64_t LastAccess(StorageId s) const override;
  bool Evictable(StorageId s) const override;
  std::int64_t RegionCompute(StorageId s) const override;
  std::int64_t AncestorCompute(StorageId s) const override;
  std::int64_t EqClassCompute(StorageId s) const override;
  std::int64_t EvictedNeighbourCompute(StorageId s) const override;
  std::int64_t AdjacentFreeBytes(StorageId s) const override;
  bool Costly(StorageId s) const override;

  absl::Status RunFrames();
  absl::Status RunFramesFrom(std::size_t base);
  OpId NewOp(std::span<const TensorId> inputs, std::int64_t cost, std::string_view name);
  absl::Status AddOutputs(OpId op, std::span<const OutputSpec> outputs);
  void AfterCompute();
  void FreeDead(StorageIndex s);
  std::string MemoryReport() const;
  void MarkEvicted(StorageIndex s);

  std::unique_ptr<Impl> impl_;
  EngineOptions options_;
  Executor* executor_;
  EngineStats stats_;
  bool pressure_sampled_ = false;
};

}  // namespace remat
