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
//   - Thrash: once the summed cost of replays (plus transfer stall, when paging) exceeds `remat_limit` (>= 0), the
//     running call fails with Aborted.
//   - No memory: the call fails with ResourceExhausted naming requested, budget, used, locked and constant bytes
//     and (arena) the largest window. A failed call releases the locks it took and leaves the engine usable: what
//     it replayed stays resident, the failed op's outputs stay unproduced (a later use replays them).
//   - Making room that fails otherwise than for lack of victims (a page-out the executor could not write, a move
//     that failed) fails the call with that error, its code and cause; as a pressure handler, MakeRoom returns it
//     to the arena, which fails the allocation with it. No error is kept aside for later.
//
// Paging (DESIGN.md "Offloading"; off by default, and then nothing below changes the engine's behaviour):
//   - A storage is resident, evicted (recomputable), or paged: its bytes are on a second tier (host memory) of
//     `paging.host_budget` bytes, never exceeded. A paged storage holds no device memory, is not a victim, and for
//     the neighbourhood costs (regions, union-find classes, evicted neighbours) counts like a resident one: a replay
//     that needs it pages it in instead of recomputing it.
//   - Victims are still chosen by the policy; per victim the engine then drops it (Evict) or pages it out:
//     `off` always drops; `always` pages while the host budget lasts (then drops); `auto` pages when the transfer
//     time that cannot be hidden, (link backlog) + 2 x (latency + bytes / bandwidth), is below the recompute cost
//     the policy sees: c(s) + its evicted neighbourhood (regions if the policy keeps them, else the union-find
//     classes, else the evicted direct neighbours) — Beaumont et al.'s criterion. PrefersPaging(s) answers it.
//   - Link model: one copy link, FIFO. A copy issued at clock t starts at max(t, link free) and occupies the link
//     for latency + bytes / bandwidth. A page-out releases device memory when it is issued (the executor orders
//     reuse after the copy; that wait is not modelled) and never delays an op. A page-in is issued when an op (or a
//     replay) needs a paged input, or earlier by Prefetch; an op starts at max(clock, ready time of its inputs'
//     page-ins): the difference is transfer stall (EngineStats::stall_ns) and advances the clock. Nothing else
//     waits for the link. With `paging.duplex` the two directions are independent links (a page-in still starts
//     after its own page-out has ended).
//   - Constants are never dropped. With `paging.page_constants` they may be paged, as a last resort: when the policy
//     finds no victim, the least recently used constant that is held only by its pin is paged out. The same holds
//     for storages pinned for good (Pin): they are constants to the policy. In arena mode only constants with an
//     address (in the arena) are paged: one outside it frees nothing there. A paged pinned storage is never
//     recomputed as the sibling of a replayed output: it comes back from its host copy.
//   - Prefetch(t) pages t's storage in ahead of use, only into free memory (it never evicts), and marks it fresh.
//     PrefetchAhead does it for a list of upcoming inputs and may, when asked, make room as an op would.
//   - A paged storage whose last reference dies loses its host copy and becomes evicted (recomputable), as a
//     resident one would; one that is recomputed (a sibling output of a replayed op) loses its host copy too.
//
// Recycling (bounded state: a run of millions of ops keeps only what is live). An op is inert once none of its
// outputs can ever be recomputed by it: each is dead (free_dead) or pinned (never recomputed), or it has none. An
// inert op no longer needs its inputs. Recycle() frees, for reuse by later ops, the inert ops whose every output
// tensor is of a dead storage, has no external reference and is read by no op that is not inert, together with
// those tensors, and the storages left with no tensor (they leave the adjacency and the union-find). Their ids then
// name new ops, tensors and storages: the caller must drop every reference it holds to the ids Recycle returns
// (records, maps). Recycle also compacts what grows with the run: the ops' input/output lists, the union-find
// (rebuilt with the same classes and values: no score changes), the deferred reserve. Nothing is recycled
// without a call (the simulator's prototype model has no dead storages and never calls it).
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
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/arena.h"
#include "policies/policy.h"
#include "runtime/config.h"
#include "runtime/executor.h"

namespace remat {

enum class AccountingMode { kCounter, kArena };

// Second-tier paging (see the contract above). Times are in the clock's unit (ns).
struct PagingOptions {
  OffloadMode mode = OffloadMode::kOff;
  double bandwidth_bytes_per_s = 12e9;  // V100 <-> pinned host, Beaumont et al.
  std::int64_t latency_ns = 10'000;     // per copy: launch and synchronization, a few us on CUDA; 10 us is cautious
  std::int64_t host_budget = std::numeric_limits<std::int64_t>::max();
  bool page_constants = false;          // weights may leave the device (last resort)
  // Two independent directions (PCIe is full duplex; V100 has separate copy engines each way): a page-in waits only
  // for earlier page-ins and its own page-out, not for other page-outs. Off: one FIFO link, as in the contract.
  bool duplex = false;
  // Before each op the caller runs (BeginOp), page in up to two paged storages expected next (PageInOrder: the order
  // the previous pass read them in, else the storage paged out last): the first of a learned order making room as
  // an op would, the others only into free memory that leaves an eighth of the budget free. For executors whose copies overlap
  // compute (CUDA's copy stream); off: pages come in on demand only.
  bool prefetch = false;
};

struct EngineOptions {
  AccountingMode mode = AccountingMode::kCounter;
  std::int64_t budget = std::numeric_limits<std::int64_t>::max();
  const Policy* policy = nullptr;          // required; not owned
  ChooseOptions choose;                    // sqrt(n) sampling, ignore small storages
  std::uint64_t seed = 0;                  // random policy and sampling
  std::int64_t remat_limit = -1;           // thrash limit on summed replay cost + stall; < 0 disables
  bool replay_views = true;                // see the contract above
  bool free_released_constants = false;    // a constant whose last reference dies is freed (baseline runs)
  // With free_released_constants and free_dead: a released constant gives its bytes back at once, because the
  // caller makes sure no replay reads it afterwards (the PyTorch bridge pins what was computed from a constant
  // before it lets the constant go). Off (remat-sim): the bytes go once nothing can read the constant (FreeDead),
  // so that a replay never has to recompute a constant.
  bool caller_guards_released_constants = false;
  // Free storages for good once nothing can need them (no reference, every storage computed from them dead):
  // they leave the neighbourhood costs. Off in the prototype's model (simrd keeps them forever).
  bool free_dead = false;
  Arena* arena = nullptr;                  // arena mode: the arena the executor allocates from (for windows, stats)
  PagingOptions paging;
  // Arena mode: when nothing more can be evicted (or paged) and the request still has no hole, find the run of
  // free blocks and movable storages that holds it with the fewest bytes to move, and move those storages out of it
  // (Executor::Relocate). Movable: resident, not evictable now (constants, pinned results, storages locked by an op
  // that waits for its other inputs), and not read or written by the kernel running now. Without this, such blocks
  // scattered among evicted ones can leave free bytes but no hole. If no such run exists (the storages to move
  // find no hole outside it), compact: in the run between barriers whose free bytes hold the request with the
  // fewest bytes of storages inside, slide every storage down (Executor::Slide) so that the free bytes become one
  // hole. Barriers: blocks the engine does not know (the running kernel's scratch and new outputs) and storages the
  // running kernel reads or writes.
  bool relocate = true;
  // Arena mode with relocate: when the free bytes hold a request that no hole holds, compact before the policy
  // evicts, if a run can be joined by moving at most this many times the request's bytes. A policy that evicts
  // until a hole forms throws away (and later recomputes) many storages to save one copy; measured on the ecosystem
  // probe's PPO at its peak: 2,489 evictions without, 166 with a limit of 2 (4 and 8 moved more and evicted more).
  // Not for policies that search windows (Coop): their windows already count free blocks. 0: evict first (the DTR
  // paper's configuration; compaction stays the last resort).
  std::size_t compact_first_limit = 2;
  // Fresh storages of at most this many bytes are last-resort victims, as deferred storages are (Defer): evicted
  // only once the pool has nothing else. Evicting one frees next to nothing, while the replay that brings it back
  // may be the whole forward pass: a program keeps small results past the backward pass (the loss, its clone for
  // logging), and when the optimizer writes a parameter they were computed from, the evicted ones must come back
  // at once, whatever memory the gradients and optimizer state hold then (measured: Hugging Face decoders of the
  // model zoo ran out there, at 1.1x their bound, replaying the forward pass for their 4-byte loss). 0 (the DTR
  // paper's configuration): every storage is an ordinary candidate; the product's configuration (the PyTorch path,
  // remat-sim's default) uses kProductLastResortBytes.
  std::int64_t last_resort_bytes = 0;
  // When running an op (a replay, or gathering the caller's op's inputs) runs out of memory, run it once more
  // gathering late: each frame replays its evicted inputs before it locks the resident ones, so a deep replay holds
  // only what it has replayed, not every resident input of every frame below it (an input evicted meanwhile is
  // replayed in turn). It can replay more (it gives up past a bound: rematerializer.h); it is tried only where the
  // first order failed, so runs that fit are unchanged. Off (the DTR paper's configuration): lock what is resident,
  // then replay the rest, and fail there.
  bool retry_gathering_late = false;
};

// The product's EngineOptions::last_resort_bytes: a loss, a scalar, a few statistics; one block of the CPU arena
// (its alignment), a fraction of one on a GPU (512). The same on every device and in both of remat-sim's modes, so
// that a recorded run replays with the same choices.
inline constexpr std::int64_t kProductLastResortBytes = 64;

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
  std::int64_t late_gathers = 0;       // runs out of memory that then fit gathering late (retry_gathering_late)
  std::int64_t heuristic_evaluations = 0;
  std::int64_t search_ns = 0;
  std::int64_t peak_bytes = 0;         // counter: peak bytes in use (prototype's max_memory); arena: peak allocated
  std::int64_t used_bytes = 0;
  double fragmentation_sum = 0;        // arena: sum over pressured allocations of free bytes / budget
  std::int64_t fragmentation_samples = 0;
  // Paging.
  std::int64_t page_outs = 0;
  std::int64_t page_ins = 0;           // prefetches included
  std::int64_t prefetches = 0;         // page-ins issued by Prefetch
  std::int64_t paged_out_bytes = 0;
  std::int64_t paged_in_bytes = 0;
  std::int64_t stall_ns = 0;           // clock time ops waited for their inputs' page-ins
  std::int64_t host_used_bytes = 0;    // second tier in use now
  std::int64_t host_peak_bytes = 0;
  // Peak of the bytes of the engine's resident storages plus the host tier's, at once: what the two tiers held
  // together (on a CPU the same RAM; the two peaks apart need not coincide, so their sum only bounds this).
  std::int64_t resident_and_host_peak_bytes = 0;
  // Relocation (arena mode).
  std::int64_t relocations = 0;
  std::int64_t relocated_bytes = 0;
  std::int64_t deferred_releases = 0;  // choices made among the deferred storages (the pool was empty)
  std::int64_t compactions = 0;        // runs compacted
  std::int64_t compacted_bytes = 0;    // bytes slid by compactions
  std::int64_t recycled_ops = 0;       // op slots freed for reuse (Recycle)
  std::int64_t recycled_storages = 0;  // storage slots freed for reuse
  // Plan mode (SetPlan): victims the plan named, and victims the policy chose because the plan held every
  // candidate resident (the run needed more room than the planned one: fragmentation, other costs).
  std::int64_t plan_victims = 0;
  std::int64_t plan_fallbacks = 0;
};

using StorageIndex = std::uint32_t;

// Sizes of the engine's tables: slots (live or free for reuse), so what the engine's host memory grows with.
struct EngineTables {
  std::size_t op_slots = 0;
  std::size_t tensor_slots = 0;
  std::size_t storage_slots = 0;
  std::size_t union_find_nodes = 0;
  std::size_t op_io_entries = 0;  // the ops' input and output lists, flattened
};

// What Recycle freed: ids that will name other ops, tensors and storages from now on.
struct RecycledIds {
  std::vector<std::uint32_t> ops;
  std::vector<std::uint32_t> tensors;
  std::vector<std::uint32_t> storages;
};

// What an engine may know of the future (Engine::SetFuture): for a storage, the ops until it is next read
// (StorageView::kNeverAgain when never). remat-sim's --foresight answers it from the trace being replayed; the PyTorch
// path knows no future yet (issue 21, plan mode).
class FutureUses {
 public:
  virtual ~FutureUses() = default;
  virtual std::int64_t OpsUntilNextUse(StorageIndex s) const = 0;
};

// What an engine may know of a plan (Engine::SetPlan, runtime/plan_guide.h): for a storage, whether the plan being
// followed holds it out of memory now, and until when. Answers < 0 when the plan holds s resident now or does not
// know it; else the position (in ops of the planned iteration) at which the plan has s back in memory, or
// kNeverBack. The driver of the run (the replay, the PyTorch bridge) keeps the plan's position.
class EvictionPlan {
 public:
  static constexpr std::int64_t kNeverBack = std::numeric_limits<std::int64_t>::max();
  virtual ~EvictionPlan() = default;
  virtual std::int64_t OutUntil(StorageIndex s) const = 0;
};

class Engine final : public PressureHandler, private StorageView {
 public:
  Engine(EngineOptions options, Executor* executor);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  static constexpr OpId kNoKernel = ~OpId{0};  // no op's kernel is running

  // A constant (weight, input): computed at cost 0, then pinned.
  absl::StatusOr<TensorId> Constant(std::int64_t bytes, std::string_view name = "constant");
  // A constant that already exists in memory (a parameter, an input the caller allocated): registered resident and
  // pinned without running anything.
  TensorId AdoptConstant(std::int64_t bytes, std::uintptr_t address, std::string_view name = "constant");
  // t's storage, evicted (an in-place write's old value, say), has its bytes again at `address` (0: unknown), copied
  // outside the engine (autograd's saved original of that in-place write): resident and evictable from here on,
  // recomputable as before. FailedPrecondition unless it is evicted, computed, unlocked, not paged, not pinned and not dead.
  absl::Status AdoptCopy(TensorId t, std::uintptr_t address);
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
  // One more / one fewer external reference to a tensor. Releasing the last reference of a storage evicts it (DTR's
  // eager eviction), unless `keep_if_replays_read` and a storage the program still refers to but that was evicted is
  // computed from it directly: then it stays resident, recomputable, until the next pressure event drops it first
  // (PressureResolver, DropReleased), so that the replay that brings that storage back finds it if memory allows.
  void Retain(TensorId t);
  void Release(TensorId t, bool keep_if_replays_read = false);
  // Makes `t` resident (replaying what it needs); counts as replay cost.
  absl::Status Rematerialize(TensorId t);
  // Locks t's storage for good (outputs at the end of a replay).
  void Pin(TensorId t);
  // Pins t's storage and keeps it where it is for good: never moved (relocation, compaction), paged out or evicted.
  // For storages whose address code outside the engine holds (an exported raw pointer). It must be resident.
  void Fix(TensorId t);
  // Makes t resident (Rematerialize) and keeps it so, and where it is, until the matching Unhold: not evicted, paged
  // out or moved (relocation, compaction). Holds nest. For storages code outside any op reads through raw pointers
  // for a while: the arguments of a composite op whose kernel reads their bytes between its nested ops (lstm's
  // batch_sizes). Unhold takes the same TensorId. The hold is on t's storage: an in-place write while held gives
  // the bytes to a new storage that is not held (the old value, if it dies meanwhile, keeps its slot until Unhold).
  absl::Status Hold(TensorId t);
  void Unhold(TensorId t);
  // t's storage stays evictable, but only once nothing else is: it leaves the eviction pool for a reserve. When the
  // pool is empty (or no window holds the request) and, in arena mode, neither paging a constant, relocation nor
  // compaction made room, MakeRoom lets the policy choose among the reserve for that one request; the storages it
  // did not choose stay deferred. For storages that are costly to get back and certain to be read soon: the
  // gradients of a backward pass. Evicted and recomputed, a deferred storage is deferred again; Pin ends it. Fresh
  // storages of at most EngineOptions::last_resort_bytes start deferred.
  void Defer(TensorId t);

  // Reported by the executor in arena mode: where storage s lives (0: outside the arena, e.g. moved to shared
  // memory).
  void SetAddress(StorageIndex s, std::uintptr_t address);
  // The executor calls this before each arena allocation so pressure is sampled once per allocation.
  void NoteAllocation();

  // PressureHandler (arena mode): evicts one storage, or one window for window policies.
  // An error when making room failed otherwise than for lack of victims (a page-out that could not write its copy,
  // a move that failed): the arena fails the allocation with it.
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) override;
  // The memory report (runtime/memory_report.h): budget, in use, locked, constant, pinned, where, largest window.
  std::string DescribeMemory() override;
  // Arena mode, after MakeRoom gave up on a kernel's allocation (the op's own kernel between BeginOp and EndOp, or a
  // replay inside Executor::Execute) and that kernel threw without writing anything, before the caller runs it
  // again: compacts the arena as MakeRoom's last resort does, but with the failed kernel's inputs movable too
  // (nothing uses them until the retry): all free bytes into one hole when no barrier splits them (the kernel may
  // need more than the request it failed on), else enough for that request. Returns whether the request MakeRoom
  // gave up on fits in one hole now (and false when there is nothing to retry for). When it does not, the request
  // stays for one more call: a composite op around the kernel, whose held arguments were barriers, asks again once
  // its kernel has unwound too (dispatch_hook.h, RetryCompositeAfterOutOfMemory).
  absl::StatusOr<bool> MakeHoleForRetry();

  // Introspection (tests, executors, integration).
  // Arena mode: the bytes of allocated arena blocks that hold no storage the engine knows (0 without an arena).
  // Inside an op, the kernel's own buffers; between ops, memory made where the engine's caller could not see it
  // (memory of a thread remat does not record, or a tensor an op made without returning it). Walks every block.
  std::int64_t UnknownArenaBytes() const;
  const EngineStats& stats() const { return stats_; }
  std::int64_t clock() const { return stats_.clock; }
  bool Defined(TensorId t) const;
  StorageIndex StorageOf(TensorId t) const;
  // From now on the DTR family ranks by the ops until each candidate's next read (FutureUses) instead of the time
  // since its last access; nullptr goes back. Not owned; must outlive its use.
  void SetFuture(const FutureUses* future) { future_ = future; }
  // From now on a victim is, first, the candidate the plan holds out of memory now that it brings back last (then
  // the larger); only when the plan holds every candidate resident does the policy choose (EngineStats counts
  // both). nullptr goes back to the policy alone. Not owned; must outlive its use.
  void SetPlan(const EvictionPlan* plan) { plan_ = plan; }
  TensorId StorageRoot(StorageIndex s) const;  // the tensor that created the storage
  bool Resident(StorageIndex s) const;
  // free_dead: nothing can ever need s again (no reference, every storage computed from it dead).
  bool Dead(StorageIndex s) const;
  // free_dead: finds the storages that became dead without their own release (their last living children were
  // pinned since, and a pinned storage needs nothing it was computed from). Looks only at the parents of what was
  // pinned since the last call; call it now and then, between ops (not inside one: Pin runs inside EndOp, before
  // the executor has moved an in-place write's memory).
  void CollectDead();
  std::int64_t StorageBytes(StorageIndex s) const;
  std::uintptr_t StorageAddress(StorageIndex s) const;
  std::int64_t ExternalRefs(TensorId t) const;
  // The external references of all of s's tensors: 0 once the program let go of it (its memory is then freed on
  // release, not evicted).
  std::int64_t StorageExternalRefs(StorageIndex s) const;
  OpId ProducerOf(TensorId t) const;
  std::span<const TensorId> OpInputs(OpId op) const;
  std::span<const TensorId> OpOutputs(OpId op) const;
  std::string_view OpName(OpId op) const;
  bool OpCostly(OpId op) const;
  std::int64_t OpCost(OpId op) const;
  std::size_t storage_count() const;
  std::size_t tensor_count() const;
  EngineTables tables() const;
  // Recycling (see the contract above). Call between ops (inside a call it frees nothing). Ops for which `held`
  // answers true (the caller still keeps something under their ids) are not freed now.
  RecycledIds Recycle(absl::FunctionRef<bool(OpId)> held = [](OpId) { return false; });
  // Whether no output of `op` can ever be recomputed by it (each dead or pinned, or none; an op whose kernel runs
  // now is not inert). A recycled op is inert.
  bool OpInert(OpId op) const;
  // Evicts a specific storage now (tests, integration); it must be evictable.
  absl::Status Evict(StorageIndex s);
  // The read-only view the policies score (benchmarks, tests, custom drivers).
  const StorageView& view() const { return *this; }
  // Storages in eviction-pool order (resident, unlocked, not constant).
  std::vector<StorageIndex> PoolOrder() const;
  // The victim the policy picks from the pool now, exactly as the engine does under pressure (the dense scan when
  // the policy has staleness weights), without evicting it. Counts heuristic evaluations and consumes the RNG like a real
  // choice. nullopt when the pool is empty. For benchmarks and tests.
  std::optional<StorageIndex> PickVictim();
  // Window policies (arena mode): the window MakeRoom would evict for `bytes` now, without evicting it. Counts
  // heuristic evaluations like a real search. nullopt without an arena, for other policies, or when none fits.
  std::optional<Window> PickWindow(std::size_t bytes);

  // Paging (see the contract above).
  bool Paged(StorageIndex s) const;
  // From now on the engine never reads the arena (EngineOptions::arena): for a forked child, where the arena's lock
  // may be held by a thread the child does not have. Peaks are the engine's count from then on; no window search.
  void ForgetArena() { options_.arena = nullptr; }
  // Switches PagingOptions::page_constants from now on (off while a caller brings everything back for good).
  void SetPageConstants(bool allowed) { options_.paging.page_constants = allowed; }
  bool page_constants() const { return options_.paging.page_constants; }
  // Pages a specific storage out now (tests, integration): it must be evictable (or, with page_constants, a
  // constant held only by its pin) and fit the host budget.
  absl::Status PageOut(StorageIndex s);
  // Pages t's storage in ahead of use if it is paged and fits in free memory without evicting anything. Returns
  // whether a page-in was issued; an error only when the executor fails otherwise than for lack of memory.
  absl::StatusOr<bool> Prefetch(TensorId t);
  // Prefetches the paged storages among `upcoming` (what the next ops will read, soonest first), stopping at the
  // first that does not fit. Meanwhile the resident ones among `upcoming` and those just paged in are held (not
  // victims). With `make_room`, a prefetch may reclaim other storages through the policy (drop or page out, as
  // for an op's needs); without, only free memory is used. Returns the number of page-ins issued.
  absl::StatusOr<int> PrefetchAhead(std::span<const TensorId> upcoming, bool make_room);
  // The drop-vs-page choice for victim s under the current mode, host budget and link state.
  bool PrefersPaging(StorageIndex s) const;
  // When paged-in storage s's bytes are (or were) on the device; 0 if never paged in.
  std::int64_t ReadyAt(StorageIndex s) const;
  // When the link (duplex: its device-to-host direction) finishes the copies issued so far.
  std::int64_t LinkFreeAt() const;
  // Link time of one copy of `bytes`: latency + bytes / bandwidth.
  std::int64_t TransferNs(std::int64_t bytes) const;

 private:
  struct Impl;
  friend class Rematerializer;  // runtime/rematerializer.h: runs ops through the steps below
  friend class Pager;           // runtime/pager.h: the second tier
  friend class PressureResolver;  // runtime/pressure_resolver.h: making room
  friend class MemoryReport;    // runtime/memory_report.h: what an out-of-memory error says
  // StorageView
  std::int64_t Clock() const override;
  std::int64_t Bytes(StorageId s) const override;
  std::int64_t Compute(StorageId s) const override;
  std::int64_t LastAccess(StorageId s) const override;
  std::int64_t Staleness(StorageId s) const override;
  bool Evictable(StorageId s) const override;
  std::int64_t RegionCompute(StorageId s) const override;
  std::int64_t AncestorCompute(StorageId s) const override;
  std::int64_t EqClassCompute(StorageId s) const override;
  std::int64_t EvictedNeighbourCompute(StorageId s) const override;
  std::int64_t AdjacentFreeBytes(StorageId s) const override;
  bool Costly(StorageId s) const override;

  // The policy's victim among the pool: the dense scan when the policy has staleness weights (and no sampling nor
  // small-storage filter), else the pool walk and Policy::Choose. nullopt when the pool is empty.
  std::optional<StorageIndex> ChooseFromPool();
  // SetPlan: the candidate the plan holds out now that it brings back last; nullopt when it holds all resident.
  std::optional<StorageIndex> PlannedVictim();
  // The dense scan (see engine_choice.cc); nullopt when the case is left to the default path.
  std::optional<StorageIndex> DenseChoice();
  // Recomputes the staleness weights marked dirty.
  void RefreshWeights();
  // The arena's window search with the policy's window costs.
  std::optional<Window> ChooseWindow(Arena& arena, std::size_t bytes);
  OpId NewOp(std::span<const TensorId> inputs, std::int64_t cost, std::string_view name);
  absl::Status AddOutputs(OpId op, std::span<const OutputSpec> outputs);
  void AfterCompute();
  void FreeDead(StorageIndex s);
  // Release's test for keeping a released storage resident, and the pressure step that drops every such storage
  // not in use (returns the bytes dropped).
  bool ReadByPendingReplay(StorageIndex s) const;
  std::int64_t DropReleased();
  // Recycling (engine_recycle.cc).
  void FreeOp(OpId op, RecycledIds& out);
  void FreeStorage(StorageIndex s, RecycledIds& out);
  void DetachFreedStorages(std::span<const StorageIndex> freed);
  void CompactOpLists();
  void CompactEqClasses();
  // A pinned storage with no reference left gives up its bytes, resident or paged (it is never recomputed).
  void DropPinnedBytes(StorageIndex s);
  // Raises stats_.peak_bytes to what is allocated now: the arena's peak in arena mode, else the engine's count.
  void NotePeak();
  void MarkEvicted(StorageIndex s, bool held_memory = true);

  std::unique_ptr<Impl> impl_;
  EngineOptions options_;
  const FutureUses* future_ = nullptr;  // SetFuture
  const EvictionPlan* plan_ = nullptr;  // SetPlan
  Executor* executor_;
  EngineStats stats_;
  std::vector<StorageIndex> newly_pinned_;  // free_dead: pinned since the last CollectDead
  // Per-call scratch kept for its capacity (no allocation per op): EndOp's specs and new constants, FreeDead's work
  // list (taken by swap, so that a nested call allocates its own).
  std::vector<OutputSpec> end_specs_;
  std::vector<TensorId> end_new_constants_;
  std::vector<StorageIndex> free_dead_work_;
};

}  // namespace remat
