// EngineBridge: the dispatch hook's observer that drives the engine (runtime/engine.h) with the ops PyTorch runs,
// and the CPU arena's pressure handler (DESIGN.md, "PyTorch integration"; integration/README.md, "How the engine
// plugs in").
//
// Storages. Every c10::StorageImpl an op reads or produces maps to the engine tensor of its current version:
//   - produced by a recorded op (fresh memory from the remat arena, replayable op, not an uninitialized factory
//     such as aten::empty): evictable;
//   - anything else (outputs of ops that drew random numbers the hook did not capture, parameters and inputs made before enable, numpy/from_blob memory, outputs of non-replayable
//     or uninitializing ops, zero-byte storages): a constant (AdoptConstant, or the op's output pinned), never
//     evicted.
// Views share their base's engine storage (a pure view op does not reach the engine).
//
// Parts. The bridge is a front over parts that each own their state, with the contract at the top of their header:
// storage_entries.h (the tracked StorageImpls: entries, the live list and the sweep's scan), storage_links.h (per
// engine storage: the StorageImpl whose version it is, the kept records that read it), record_store.h (which ops
// have kept records, when to prune, reused ReplayOps) and op_in_flight.h (the op between BeforeOp and AfterOp: its
// writes, the generator before it, the plan of its outputs). engine_bridge.cc drives the engine per op;
// engine_bridge_storages.cc keeps entries, links and records in step with the engine (release, pins, pruning,
// recycling, exports). The executor (torch_executor.h) holds the records themselves and the storages' homes.
//
// Per op: BeforeOp sweeps for storages whose last user reference died, maps the inputs, and calls BeginOp
// (rematerializes evicted inputs and locks them); the kernel runs; AfterOp calls EndOp with the fresh outputs
// (bytes, address) and the in-place writes (OutputSpec::in_place_of), keeps the record for replays if some output
// is evictable, and sets arena owners (storage + 1) for window policies. OpFailed calls AbortOp.
//
// Last references. The records keep strong references to the StorageImpls they read (so that replays can restore
// into them), so a storage's death is observed as "its use count is no more than the references remat's records
// hold", not counting its Python object's while torch alone keeps that object alive (HeldBeyond). BeforeOp checks
// every live storage records hold (O(such storages) per op), the others before the engine chooses victims
// (EngineBridge::Sweep), and Releases the dead in the engine: an evictable storage is evicted at once (still
// recomputable), unless an evicted storage the program still refers to is computed from it: then its bytes stay
// until the next pressure event drops them first (Engine::Release); a constant's memory is freed.
//
// Writes to constants (optimizer steps, zero_ of a gradient, fills of an aten::empty result): a replay after the
// write would read the new value. So before such a write every live storage whose replay could read the old value
// (directly or through storages nobody holds any more, following the kept records) is made resident
// (rematerialized if needed) and pinned; likewise before a constant that records still read is freed, unless it
// is kept instead: a small one (up to 4 KiB, a wrapped scalar; 1/64 of the budget in all), or one whose Python
// object kept it past the program's last use (a compiled block's input) while its bytes are under half of what
// pinning would cost. A large kept constant goes once no live storage's replay needs it
// (ReleaseUnneededKeptConstants); any kept constant goes at the latest when its records are pruned.
// Exception: a blank constant (an aten::empty result nobody wrote yet) that an op overwrites entirely without
// reading it (fill_, zero_, copy_, the random fills such as dropout's bernoulli_, an out= argument) becomes an
// ordinary output of that op: evictable, replayed into a fresh buffer.
// Constants an op writes without returning them (batch norm's running_mean/running_var) are not engine inputs:
// replays give the op fresh memory in their place (in training mode its outputs do not depend on them; any other op
// with such writes is not replayed, op_effects.h).
//
// Relocation. Constants are never evicted, and the blocks they hold (gradients, optimizer state, results pinned
// because what they were computed from changed) are scattered among evictable ones, so the arena can have the
// free bytes a request needs but no hole. When nothing more can be evicted or paged, the engine moves constants
// out of the cheapest window (EngineOptions::relocate); TorchExecutor::Relocate copies the bytes and swaps the
// StorageImpl's DataPtr, as eviction does, so views and saved tensors follow. What users can see: the data_ptr()
// of a tensor made under remat may change between ops, as it does when remat evicts and restores it; raw
// pointers into it (a numpy array from .numpy()) must not be kept across ops.
//
// The bridge tells held_references.h how many references its records hold on a storage (remat.record() uses it
// to see a storage's death).
//
// Paging (BridgeOptions::paging, off by default). The engine pages storages out to a HostTier (host_tier.h: host
// memory outside the arena, or a temporary file) instead of dropping them (`always`, or `auto` when the copy is
// cheaper than the recomputation), and with paging.page_constants pages out the least recently used constant or
// pinned storage held only by its pin when nothing else can go: gradients, optimizer state, anything the bridge
// pinned, as long as it lives in the arena (parameters made before enable live outside it and stay). Whatever an
// op reads or writes is paged in first: its engine inputs by BeginOp, and the constants it writes without
// returning them (batch norm's running stats) by Engine::Hold, which keeps them resident and in place until the
// kernel has run (ReleaseSideHolds). A blank constant an op overwrites is paged in before it leaves the engine.
//
// Pruning. Every 1024 ops the bridge drops the records whose outputs the engine reports dead (nothing can need
// them again: EngineOptions::free_dead) and forgets storages that are released, unreferenced and read by no kept
// record, so that a long training run does not grow by a record per op.
//
// Backward. The outputs of ops that autograd's engine runs for a backward pass (OpRecord::in_backward: the
// parameters' gradients and the gradients flowing between layers) are deferred (Engine::Defer): evicted only once
// nothing else can be. Recomputing one replays the backward pass up to it (and the forward ops that pass reads),
// while a forward activation comes back by replaying forward ops from the nearest resident one; checkpointing
// recomputes only forward activations for the same reason. The optimizer's first write pins the parameters'
// gradients (writes to constants, above), and PinState pins the optimizer's state after each step.
//
// Out of memory inside an op's kernel: the hook asks RetryAfterOutOfMemory (ops that write none of their arguments).
// The arena is compacted with the op's inputs movable, since no kernel uses them until the retry: the inputs of a
// running kernel cannot move, so where they happen to sit can leave free bytes but no hole, and only a retry gets
// them out of the way. The arguments a composite op around that kernel holds in place are barriers too: when they
// block the hole, the composite runs again from the start once it has unwound (RetryCompositeAfterOutOfMemory; the
// hook decides whether it may, composite_attempt.h).
//
// Compiled graphs (opaque_call.h; remat/_compile.py): a call of a torch.compile'd graph is one op,
// remat::compiled_graph, whose inputs are locked for the call and whose inner ops are not seen. What the engine can
// do with its outputs: page them (paging on: they are constants, paged out between the forward and the backward),
// or, drop-only, drop them and replay the graph (a forward graph on the CPU: its dropout seeds come from a copy of
// the generator's state, the small inputs it writes, batch norm's running statistics, from a copy taken before it).
// With paging on, outputs are never dropped: a replay needs the graph's whole working set at once, a page-in only
// the one tensor. Nothing inside a call can be evicted: a graph's own peak is a floor no budget goes below.
//
// Threads (engine_lock.h): one EngineLock, held from BeforeOp to AfterOp/OpFailed, serializes the recorded ops of
// every thread (autograd's engine threads included) and every other entry point. While an op's kernel (or a
// replay's) runs, the lock is lent: an allocation that needs room on any thread (the kernel's intra-op workers, an
// unrelated thread) borrows it and makes room, one at a time; otherwise MakeRoom waits for the lock. No allocation
// fails because another thread is inside an op.
//
// Retire (before the session destroys the bridge, from any thread): waits for the running op, makes every live
// storage resident and pinned (MaterializeLive), and from then on records nothing and makes no room: ops still in
// flight on other threads pass through, reading resident memory.
#pragma once

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "integration/cpu_device_memory.h"
#include "integration/device_memory.h"
#include "integration/dispatch_hook.h"
#include "integration/engine_lock.h"
#include "integration/held_references.h"
#include "integration/host_tier.h"
#include "integration/op_in_flight.h"
#include "integration/plan_driver.h"
#include "integration/record_store.h"
#include "integration/storage_entries.h"
#include "integration/storage_links.h"
#include "integration/torch_executor.h"
#include "policies/policy.h"
#include "runtime/engine.h"

namespace remat::integration {

struct BridgeOptions {
  std::size_t budget = 0;
  std::string policy = "dtr-eq";  // a name from policies/registry.h
  // The memory the engine evicts from (not owned; outlives the bridge): the CPU arena (CpuDeviceMemory over
  // InstalledCpuArena()) or a CUDA device's. nullptr: CpuDeviceMemory with no arena.
  DeviceMemory* memory = nullptr;
  OpObserver* next = nullptr;     // also told about every op (the session's tracker: counts, traces)
  // Op costs for the engine: measured wall time (default), or EstimatedCostNs (op_cost.h): the same choices in
  // every run.
  bool estimated_costs = false;
  // Paging to a second tier (issue 7; see "Paging" above). paging.mode off: no tier is made and nothing below
  // applies. paging.host_budget is both the engine's and the tier's budget. The link model's bandwidth and latency
  // only feed the engine's drop-or-page choice (`auto`) and its stall figures: on CPU a copy is a memcpy (or a
  // pwrite/pread for the file tier) done synchronously by PageOut/PageIn.
  PagingOptions paging;
  HostTierKind host_tier = HostTierKind::kMemory;
  std::string host_tier_directory;  // kFile: where its temporary file goes (empty: $TMPDIR, else /tmp)
};

// The default link model for the CPU tier: a fixed 8 GB/s and 1 us per copy. A copy is a memcpy between two places
// in host memory; on the development machine (2 cores, loaded, 2026-11) it ran between 2 and 20 GB/s for blocks of
// 64 KiB to 16 MiB depending on size and load, so a fixed middle value keeps `auto`'s choices reproducible.
inline constexpr double kCpuTierBandwidthBytesPerS = 8e9;
inline constexpr std::int64_t kCpuTierLatencyNs = 1'000;

struct BridgeStats {
  EngineStats engine;
  EngineTables engine_tables;
  ExecutorStats executor;
  std::int64_t ops = 0;             // ops given to the engine
  std::int64_t constants = 0;       // storages adopted as constants
  std::int64_t pinned_outputs = 0;  // outputs and in-place writes made constants (not replayable, not arena, ...)
  std::int64_t generations = 0;     // constants overwritten or freed while records read them
  std::int64_t released = 0;        // storages whose last user reference died
  std::int64_t kept_constant_bytes = 0;  // dead constants kept because records read them (ReleaseIfDead)
  std::int64_t pruned_records = 0;       // records dropped because nothing can need their outputs any more
  std::int64_t pruned_entries = 0;       // storages forgotten for the same reason
  std::int64_t kept_records = 0;         // records kept now (as of the last prune, plus the ops since)
  std::int64_t tracked_storages = 0;     // storages the bridge knows now
  std::int64_t retried_ops = 0;          // kernels run again after running out of memory (RetryAfterOutOfMemory)
  std::int64_t retried_composites = 0;   // composite ops run again after running out (RetryCompositeAfterOutOfMemory)
  std::int64_t borrowed_room = 0;        // MakeRoom calls of other threads while an op's kernel ran (intra-op workers, other threads)
  std::int64_t deferred_outputs = 0;     // outputs of backward-pass ops, deferred (Engine::Defer)
  std::int64_t pinned_state = 0;         // storages pinned by PinState (optimizer state)
  // Copies autograd saved of values in-place ops overwrote (OpRecord::hidden_copies): adopted as the old value
  // (evictable, recomputable), or as constants when they cannot stand for it.
  std::int64_t adopted_copies = 0;
  std::int64_t constant_copies = 0;
  // Arena blocks no engine storage holds, at the time of Stats() (Engine::UnknownArenaBytes).
  std::int64_t unknown_arena_bytes = 0;
  HostTierStats host_tier;               // zeros without paging
  PlanDriverStats plan;                  // policy "plan" (plan_driver.h); zeros otherwise
};

class EngineBridge final : public OpObserver, public PressureHandler, public HeldReferenceCounter {
 public:
  // InvalidArgument for an unknown policy (the message lists the registered ones).
  static absl::StatusOr<std::unique_ptr<EngineBridge>> Create(const BridgeOptions& options);
  ~EngineBridge() override;

  void BeforeOp(OpRecord& record) override;
  void AfterOp(OpRecord&& record) override;
  void OpFailed(OpRecord& record) noexcept override;
  // Compacts the arena with the op's inputs movable (Engine::MakeHoleForRetry); true when the request that failed
  // fits now.
  bool RetryAfterOutOfMemory(OpRecord& record) override;
  // The same for a composite op whose kernel unwound (its arguments released by EndComposite, so they may move).
  bool RetryCompositeAfterOutOfMemory() override;
  // A composite op's arguments (dispatch_hook.h): each becomes an entry if it was not one (a constant); one of
  // `read_raw` is brought back if evicted or paged, one of `passed_on` only if resident, and either is then held
  // (Engine::Hold: resident and in place) until EndComposite. Storages of released entries are left alone (nothing
  // evicts them: the engine forgot them).
  void BeginComposite(std::span<c10::StorageImpl* const> read_raw, std::span<c10::StorageImpl* const> passed_on,
                      CompositeHold& hold) override;
  void EndComposite(CompositeHold& hold) noexcept override;
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) override;
  // The engine's report (Engine::DescribeMemory); empty when another thread is inside an op.
  std::string DescribeMemory() override;
  // References the kept records hold on `storage` (held_references.h).
  std::int64_t HeldReferences(const c10::StorageImpl* storage) override;

  // Pins the storage for good, as a constant (resident from now on): for state a program keeps across steps and
  // rewrites in place, such as an optimizer's (the Python package calls it after every optimizer step). Recomputing
  // such a storage would replay every step since it was made. Storages remat did not make are constants already.
  // Returns whether it pinned something.
  bool PinState(c10::StorageImpl* impl);
  // The end of a training iteration (remat.mark_step(), after each optimizer step): with policy "plan", the plan
  // driver records, plans or follows from the next iteration on (plan_driver.h). Nothing to do otherwise.
  void MarkStep();
  // The storages that hold budgeted memory now (tracked, resident, in the memory the budget counts), held: what a
  // recording that starts now must declare (TraceRecorder::Declare), or its replay misses memory the program keeps
  // without touching (last step's gradients before zero_grad).
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> HeldStorages();
  // Plan mode: the recorded iteration the last plan was made from (PlanDriver::PlannedTrace); empty otherwise.
  std::string PlannedTrace();
  // An export: code outside the dispatcher is about to hold `impl`'s bytes or address (numpy(), DLPack, data_ptr(),
  // untyped_storage(), torch.save). Brings them back if evicted or paged and fixes the storage (Engine::Fix: never
  // evicted, moved or paged out again while it lives). `writable`: the export may write the bytes without remat
  // seeing it (a numpy array, a DLPack capsule), so what was computed from them is pinned now and ops that read
  // them from now on are not replayed (their outputs are pinned). Storages remat does not know need nothing.
  absl::Status MakeResident(c10::StorageImpl* impl, bool writable);
  // `impl`'s bytes are about to change or go outside the dispatcher (UntypedStorage.resize_: FSDP2 frees an
  // unsharded parameter after use and gathers it again later). What was computed from the bytes as they are now is
  // pinned first (as for a write to a constant), brought back if evicted, so that no replay reads the storage after
  // the change; the storage itself is fixed (never evicted or moved: its size and address are about to change under
  // the engine). Storages remat does not know need nothing.
  absl::Status StorageWillChange(c10::StorageImpl* impl);
  // Cross-device ops (device_router.h): `record` is recorded by another device's bridge and reads `reads` (indices
  // into record.input_storages), storages of this bridge's device. BeginRead brings them back (replays or pages them
  // in: Engine::BeginOp) and keeps them locked and in place while the kernel runs, the lock lent as for an op of its
  // own; EndRead unlocks them (an op with no outputs here: their access, its cost on this engine's clock; `failed`:
  // Engine::AbortOp). The op's outputs are the other engine's. No observer (`next`) is told: the recording bridge is.
  void BeginRead(const OpRecord& record, std::span<const int> reads);
  void EndRead(const OpRecord& record, bool failed) noexcept;
  // `storage` has no memory because this engine evicted or paged it (the router's test for an evicted storage whose
  // device nothing else tells: CPU tensors over a device's memory, on the CUDA runtime's test double).
  bool HoldsOutOfMemory(const c10::StorageImpl* storage);
  // Waits for the op running now, MaterializeLive, then stops: later ops pass through unrecorded and MakeRoom makes
  // no room. The session calls it before it detaches and destroys the bridge (engine_session.h).
  absl::Status Retire();
  // fork(): the lock is held across it (waiting for the op running now), then released in the parent and in the
  // child, where the forking thread is the only one and the engine's state is whole.
  void LockForFork() { lock_.LockForFork(); }
  void UnlockAfterFork() { lock_.UnlockAfterFork(); }
  // In the child, right after the fork (engine_bridge_plan.cc): the arena's own lock may have been held by a parent
  // thread the child does not have (an allocation on another thread), and the child never touches an arena again
  // (cpu_allocator.h), so the engine forgets it (Engine::ForgetArena: it hung reading the arena's peak after an
  // op); plan mode is off in the child (PlanDriver::AfterForkInChild).
  void AfterForkInChild();
  // Makes every live storage resident again (before remat is switched off: user tensors must keep their data).
  // Allocations then come from whatever allocator is installed. Nothing is paged out meanwhile; ResourceExhausted
  // when some of what is held does not fit back (it is still in the host tier).
  absl::Status MaterializeLive();
  BridgeStats Stats();

 private:
  using Entry = StorageEntries::Entry;
  EngineBridge(const BridgeOptions& options, std::unique_ptr<Policy> policy, std::unique_ptr<HostTier> tier);
  Entry& EntryFor(c10::StorageImpl* impl);
  // Releases the entries whose storage no user holds any more (header: "Last references"; StorageEntries). The
  // storages records hold, every op: they keep their bytes until released, so a late release would raise the peak
  // (a rotating partial sweep of all entries was tried: the unconstrained peak of examples/cpp/train_mlp rose from
  // 9.4 to 15.0 MB). The others gave their memory back when they died, and the engine only needs to hear of it
  // before it chooses victims: SweepUnheld runs every kUnheldSweepEvery ops, at the op after one that made room
  // (so under pressure every op, as before), in MakeRoom (the onset of pressure) and every op while memory history
  // is recorded (its release events carry the storage's address, which a later allocation may reuse).
  void Sweep();
  void SweepUnheld();
  static constexpr std::int64_t kUnheldSweepEvery = 64;
  // HeldStorages with the bridge's lock held.
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> HeldStoragesLocked();
  void ReleaseIfDead(Entry& entry);
  // AfterOp, an in-place write of input storage k whose old value is engine tensor `old`: when autograd saved a copy
  // of it (OpRecord::hidden_copies) that holds the whole storage, the copy becomes that old value's home, resident
  // and evictable, and its entry takes over old's reference; false otherwise (the caller releases old).
  bool AdoptHiddenCopy(OpRecord& record, int k, TensorId old);
  // AfterOp: the hidden copies AdoptHiddenCopy did not take become constants (known, so movable and pageable).
  void AdoptRemainingCopies(OpRecord& record);
  // entry's storage, with its size and address now, becomes a new engine constant (its old engine tensor, if any,
  // is the caller's to release first).
  void AdoptAsConstant(Entry& entry, const c10::intrusive_ptr<c10::StorageImpl>& impl);
  // Why PinDependents brings results back, said only by the error of a replay that runs out of memory on the way:
  // the op about to overwrite the value (`writer`), else what happens to it (`event`: "went away").
  struct PinReason {
    absl::string_view writer;
    absl::string_view event;
  };
  // Pins every live storage whose replay could read constant `start` (bringing back the evicted ones): `start` is
  // about to change or go away, for `reason`.
  void PinDependents(StorageIndex start, PinReason reason);
  // Marks a dying constant kept (ReleaseIfDead) and counts its bytes, `small` or not; ForgetKeptConstant undoes it.
  void KeepConstant(Entry& entry, std::int64_t bytes, bool small);
  void ForgetKeptConstant(Entry& entry);
  // A released constant's end: the engine forgets it and its memory goes now (the StorageImpl may live on, held by
  // records or by its Python object).
  void LetConstantGo(Entry& entry);
  // Lets go large kept constants that no live storage's replay needs any more (what was computed from them died or
  // was pinned), after a sweep that released storages. Bounded per call: it looks at kKeptConstantsPerSweep of them in
  // turn, and a walk that meets more than kNeededWalkLimit storages before it finds a live one that needs the
  // constant counts as needed (Prune lets it go later).
  void ReleaseUnneededKeptConstants();
  static constexpr std::size_t kKeptConstantsPerSweep = 4;
  static constexpr std::size_t kNeededWalkLimit = 128;
  // PinDependents' walk: calls visit(entry) for every live storage whose replay could read constant `start`
  // (directly, or through storages no user holds any more), until visit returns false. False when it stopped
  // because it had met more than `max_storages` storages.
  bool ForEachDependent(StorageIndex start, absl::FunctionRef<bool(Entry&)> visit,
                        std::size_t max_storages = SIZE_MAX);
  // What PinDependents(start) costs (letting constant `start` go while records read it): the bytes it newly pins,
  // or those it brings back now (its evicted or paged dependents: pinning a resident one costs no memory now), not
  // counting gradients (Entry::from_backward: the optimizer step brings each back anyway).
  enum class PinCost { kNewlyPinned, kBroughtBack };
  // Whether that cost is more than `bytes`; the walk stops once it knows.
  bool PinningCostsMoreThan(StorageIndex start, std::int64_t bytes, PinCost cost);
  // Whether a live storage that is not pinned could need a replay that reads `start` (the walk stops at the first),
  // or the walk met more than `max_storages` storages without knowing.
  bool NeededForReplays(StorageIndex start, std::size_t max_storages);
  // Brings entry's storage back if evicted or paged and pins it; `reason`, if given, ends the error of a failed
  // replay (PinDependents).
  void PinEntry(Entry& entry, const PinReason* reason = nullptr);
  // Brings entry's storage back if evicted or paged, pins it and fixes it in place (Engine::Fix): for storages whose
  // bytes or address code outside the dispatcher holds or is about to change (MakeResident, StorageWillChange).
  absl::Status FixEntry(Entry& entry);
  using Export = OpInFlight::Export;
  // MakeResident's and StorageWillChange's work, the lock held and not lent (or lent by a caller that is not inside
  // the op's kernel). A storage remat does not track needs nothing, unless it was evicted (an error).
  absl::Status ExportLocked(c10::StorageImpl* impl, Export kind);
  // The caller is code inside the kernel of the op in flight (a Python dispatch mode's handler, a kernel written in
  // Python): this thread holds the lock and lends it.
  bool InsideOpKernel();
  // An export from inside the op's kernel: of the op's own storages (its inputs, and untracked ones, which may be
  // its outputs), after the op (AfterOp: ApplyExportsFromInsideOp); of any other, now, the lend paused.
  absl::Status ExportInsideOp(c10::StorageImpl* impl, Export kind);
  void ApplyExportsFromInsideOp();
  // Adds `delta` to the record_refs of the entries of the storages `record` holds (its input storages and its
  // arguments' tensors). `entries`, when given, are the entries of record.input_storages (no lookup).
  void CountRecordRefs(const OpRecord& record, int delta = 1, std::span<Entry* const> entries = {});
  // The references a kept record holds, counted per input storage once when it is kept (ReplayOp::input_refs:
  // no walk of its arguments and fewer lookups when it is dropped). `entries`: those of its input storages.
  void HoldRecordRefs(ReplayOp& replay, std::span<Entry* const> entries);
  void ReleaseRecordRefs(const ReplayOp& replay);
  bool Replayable(const OpRecord& record, bool generator_moved);
  // AfterOp's steps (engine_bridge.cc), for spec j of current_.plan once EndOp named its tensor. A fresh storage
  // gets an entry and a home, and is evictable with the record kept for replays when the op is replayable, else
  // pinned; an in-place write of input k makes the entry's new version (the old one released, unless a hidden copy
  // adopts it). Each returns whether the record must be kept for that output.
  bool RegisterFreshOutput(const OpRecord& record, std::size_t j, bool replayable);
  bool RegisterInPlaceOutput(OpRecord& record, std::size_t j, bool replayable);
  void DeferIfBackward(const OpRecord& record, TensorId t);
  // Keeps the op's record for replays (a ReplayOp holding what current_ gathered) and links its readers.
  void KeepRecord(OpRecord&& record);
  // BeforeOp's steps (engine_bridge.cc), filling current_ (after OpInFlight::NoteWrites).
  void DetachOverwrittenBlanks(const OpRecord& record);
  void GatherEngineInputs(const OpRecord& record);
  void ReleaseSideHolds() noexcept;  // unholds current_.side_held (after the kernel, or when the op fails)
  void Prune();
  void DropInertRecords();
  // Plan mode (engine_bridge_plan.cc): the driver for the bridge's budget, arena and paging; the op EndOp just
  // registered, with the storages it made (fresh and in-place outputs, in the specs' order).
  std::unique_ptr<PlanDriver> MakePlanDriver() const;
  void NotePlannedOp(std::string_view name, std::span<const OutputSpec> specs, std::span<const TensorId> outs);
  void Recycle();
  void Unlock();

  BridgeOptions options_;
  CpuDeviceMemory default_memory_{nullptr};
  DeviceMemory* memory_;  // options_.memory, else default_memory_
  std::unique_ptr<Policy> policy_;
  std::unique_ptr<HostTier> tier_;  // paging on; outlives the engine (the destructor resets the engine first)
  TorchExecutor executor_;
  std::unique_ptr<Engine> engine_;
  EngineLock lock_;
  std::atomic<bool> retired_{false};
  // The parts that own the bridge's state (each file states its contract).
  StorageEntries entries_;  // storage_entries.h: the tracked StorageImpls, their live lists and the sweeps
  std::int64_t ops_since_unheld_sweep_ = 0;  // Sweep
  bool room_made_since_unheld_sweep_ = false;
  StorageLinks links_;      // storage_links.h: per engine storage, its owner and the kept records reading it
  RecordStore records_;     // record_store.h: which ops have kept records, pruning's cadence, spare ReplayOps
  OpInFlight current_;  // op_in_flight.h: the op between BeforeOp and AfterOp
  std::vector<StorageIndex> read_by_dropped_;  // DropInertRecords' scratch
  // The constants ReleaseIfDead keeps that are not small; small ones stay until Prune, under their own cap (letting
  // them go sooner moved placements: a sampling loop with a key/value cache ran out at 0.7, test_in_place_chains).
  std::vector<Entry*> large_kept_constants_;  // exactly the kept entries that are not kept_small
  std::size_t kept_constants_next_ = 0;  // where ReleaseUnneededKeptConstants looks next
  std::int64_t small_kept_constant_bytes_ = 0;  // the small ones' share of stats_.kept_constant_bytes
  std::unique_ptr<PlanDriver> plan_;  // policy "plan" only (plan_driver.h)
  std::vector<StorageIndex> plan_made_;  // NotePlannedOp's scratch
  BridgeStats stats_;
};

}  // namespace remat::integration
