// EngineBridge, the ops: creation, BeforeOp/AfterOp/OpFailed (the dispatch hook's observer), making room for the
// arena, retiring and statistics. The storage entries and their lifecycle are engine_bridge_storages.cc; the
// contract is engine_bridge.h.
#include "integration/engine_bridge.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "integration/composite_attempt.h"
#include "integration/engine_bridge_internal.h"
#include "integration/op_cost.h"
#include "integration/op_effects.h"
#include "integration/opaque_call.h"
#include "integration/pin_listener.h"
#include "integration/storage_eviction.h"
#include "policies/registry.h"

namespace remat::integration {

using bridge_internal::AddressOf;
using bridge_internal::ForEachTensor;
using bridge_internal::Throw;

namespace {

// An in-place chain longer than this makes the storage a constant (StorageEntries::Entry::in_place_writes): a
// restore would replay every write since the storage was made, each needing what it wrote.
constexpr std::uint32_t kLongestReplayedInPlaceChain = 8;

}  // namespace

absl::StatusOr<std::unique_ptr<EngineBridge>> EngineBridge::Create(const BridgeOptions& options) {
  absl::StatusOr<std::unique_ptr<Policy>> policy = MakePolicy(options.policy);
  if (!policy.ok()) return policy.status();
  if (options.budget == 0) return absl::InvalidArgumentError("remat: the budget must be > 0 bytes");
  std::unique_ptr<HostTier> tier;
  if (options.paging.mode != OffloadMode::kOff) {
    if (options.paging.host_budget <= 0) {
      return absl::InvalidArgumentError("remat: the host budget for paging must be > 0 bytes");
    }
    if (!(options.paging.bandwidth_bytes_per_s > 0) || options.paging.latency_ns < 0) {
      return absl::InvalidArgumentError("remat: the paging link needs a bandwidth > 0 and a latency >= 0");
    }
    absl::StatusOr<std::unique_ptr<HostTier>> made =
        HostTier::Create(HostTierOptions{options.host_tier, options.paging.host_budget, options.host_tier_directory});
    if (!made.ok()) return made.status();
    tier = std::move(*made);
  }
  return std::unique_ptr<EngineBridge>(new EngineBridge(options, std::move(*policy), std::move(tier)));
}

EngineBridge::EngineBridge(const BridgeOptions& options, std::unique_ptr<Policy> policy,
                           std::unique_ptr<HostTier> tier)
    : options_(options),
      memory_(options.memory != nullptr ? options.memory : &default_memory_),
      policy_(std::move(policy)),
      tier_(std::move(tier)) {
  EngineOptions engine_options;
  engine_options.mode = AccountingMode::kArena;
  engine_options.budget = static_cast<std::int64_t>(options.budget);
  engine_options.policy = policy_.get();
  engine_options.arena = memory_->arena();
  engine_options.free_released_constants = true;  // we free a dead constant's memory ourselves (Sweep)
  engine_options.caller_guards_released_constants = true;  // PinDependents before a constant read by records goes
  engine_options.free_dead = true;
  engine_options.last_resort_bytes = kProductLastResortBytes;  // small results go last
  engine_options.retry_gathering_late = true;
  engine_options.paging = options.paging;
  executor_.SetMemory(memory_);
  executor_.SetHostTier(tier_.get());
  executor_.SetLock(&lock_);
  engine_ = std::make_unique<Engine>(engine_options, &executor_);
  if (options.policy == kPlanPolicy) plan_ = MakePlanDriver();
}

EngineBridge::~EngineBridge() {
  executor_.Clear();
  engine_.reset();
  tier_.reset();
}

void EngineBridge::Unlock() {
  executor_.SetRunningOp(nullptr);
  lock_.unlock();
}

void EngineBridge::BeforeOp(OpRecord& record) {
  lock_.lock();
  try {
    if (retired_.load(std::memory_order_acquire)) {  // being destroyed: the op runs unrecorded
      current_.active = false;
      lock_.BeginLend();
      return;
    }
    if (options_.next != nullptr) options_.next->BeforeOp(record);
    engine_->NoteAllocation();
    Sweep();
    if (records_.DuePrune()) Prune();
    current_.NoteWrites(record);
    DetachOverwrittenBlanks(record);
    GatherEngineInputs(record);
    const std::vector<TensorId>& engine_inputs = current_.engine_inputs;
    const OpTraits& traits = *record.traits;
    current_.WatchGenerator(record);
    absl::StatusOr<OpId> op = engine_->BeginOp(engine_inputs, traits.name);
    if (!op.ok()) Throw(op.status());
    // From here the kernel may read its inputs: their memory must not move (until now, while BeginOp replayed
    // what they need, it could).
    executor_.SetRunningOp(&record);
    current_.NoteWrittenSizes(record);  // its inputs are resident now
    current_.op = *op;
    current_.active = true;
    if (policy_->UsesWindows()) {
      memory_->SetPlacementForThisThread(engine_->OpCostly(*op) ? Placement::kLow : Placement::kHigh);
    }
    lock_.BeginLend();  // the kernel runs now: allocations on any thread may borrow the lock to make room
  } catch (...) {
    current_.active = false;
    ReleaseSideHolds();
    Unlock();
    throw;
  }
}

// Blank constants (aten::empty results nobody wrote) the op overwrites entirely leave the engine now: nothing can
// read their garbage, and AfterOp registers the new value as a fresh output (current_.overwrite).
void EngineBridge::DetachOverwrittenBlanks(const OpRecord& record) {
  const std::size_t n = record.input_storages.size();
  for (std::size_t k = 0; k < n; ++k) {  // only a storage passed once (not also read)
    if (!current_.covered[k]) continue;
    Entry* found = entries_.Find(record.input_storages[k].get());
    if (found == nullptr || !found->blank || found->released) continue;
    int uses = 0;
    for (const c10::IValue& value : record.arguments) {
      ForEachTensor(value, [&](const at::Tensor& t) {
        uses += t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == record.input_storages[k].get();
      });
    }
    if (uses != 1) continue;
    Entry& entry = *found;
    const StorageIndex old = engine_->StorageOf(entry.root);
    if (engine_->Paged(old)) {  // its memory comes back for the op to write into
      if (absl::Status status = engine_->Rematerialize(entry.root); !status.ok()) Throw(status);
    }
    if (entry.record_refs > 0) PinDependents(old, {.writer = record.traits->name, .event = {}});
    executor_.ClearHome(old);
    links_.ClearOwner(old);
    engine_->Release(entry.root);
    entry.blank = false;
    entry.pinned = false;
    current_.overwrite[k] = true;
    NoteBlankOverwritten(record.input_storages[k].get());
  }
}

// The engine inputs of the op (current_.engine_inputs), in the order EndOp's in_place_of positions count
// (current_.inputs maps each input storage to its engine tensor): constants written on the side are pinned with
// what a replay could compute from them, and go last.
void EngineBridge::GatherEngineInputs(const OpRecord& record) {
  const std::size_t n = record.input_storages.size();
  std::vector<StorageIndex>& overwritten = current_.written_constants;
  overwritten.clear();
  std::vector<TensorId>& engine_inputs = current_.engine_inputs;
  engine_inputs.clear();
  current_.input_entries.assign(n, nullptr);
  for (std::size_t k = 0; k < n; ++k) {
    Entry& entry = EntryFor(record.input_storages[k].get());
    current_.input_entries[k] = &entry;
    if (current_.overwrite[k] || !current_.written[k]) continue;
    // Written on the side (running stats): a constant, replayed on a copy. Like any constant written, whatever
    // a replay could compute from its old value is pinned first (an eval-mode batch norm read the running stats).
    if (!current_.written_returned[k]) PinEntry(entry);
    if (entry.pinned) overwritten.push_back(engine_->StorageOf(entry.root));
  }
  for (const StorageIndex s : overwritten) PinDependents(s, {.writer = record.traits->name, .event = {}});
  for (std::size_t k = 0; k < n; ++k) {
    if (current_.overwrite[k] || (current_.written[k] && !current_.written_returned[k])) continue;
    current_.inputs[k] = current_.input_entries[k]->root;
    engine_inputs.push_back(current_.inputs[k]);
  }
  // Constants written on the side are not engine inputs: a replay gives the op fresh memory in their place (its
  // outputs ignore them: op_effects.h, 3), so the engine must not need them to replay it (InstanceNorm's repeated
  // running statistics die inside the op). They are held instead, resident and in place, while the kernel runs
  // (ReleaseSideHolds).
  for (std::size_t k = 0; k < n; ++k) {
    if (current_.overwrite[k] || !current_.written[k] || current_.written_returned[k]) continue;
    const TensorId side = current_.input_entries[k]->root;
    if (std::find(current_.side_held.begin(), current_.side_held.end(), side) != current_.side_held.end()) continue;
    if (absl::Status status = engine_->Hold(side); !status.ok()) Throw(status);
    current_.side_held.push_back(side);
    executor_.WillRead(*engine_, engine_->StorageOf(side));  // after a prefetch's copy, as BeginOp's inputs
  }
}

void EngineBridge::ReleaseSideHolds() noexcept {
  for (const TensorId t : current_.side_held) engine_->Unhold(t);
  current_.side_held.clear();
}

// Whether a replay of the op would give its outputs back (after its kernel ran: `generator_moved` is
// OpInFlight::GeneratorMoved, which reads the generator's state, asked once per op by AfterOp).
bool EngineBridge::Replayable(const OpRecord& record, bool generator_moved) {
  const std::size_t n = record.input_storages.size();
  // An op that read an exported storage (MakeResident, writable) may have read bytes written behind remat's back,
  // which a replay would not see again.
  bool reads_export = false;
  for (std::size_t k = 0; k < n; ++k) reads_export = reads_export || current_.input_entries[k]->exported;
  // A compiled graph's replay runs the whole graph again and needs its whole working set at once (every buffer of
  // a block's forward, while the op that wanted one output holds its own inputs): with a second tier, paging its
  // outputs costs a copy and no transient memory, so they stay constants (pageable); drop-only, they are replayed.
  const bool compiled_graph_paged =
      options_.paging.mode != OffloadMode::kOff && record.traits->name == kOpaqueCallOperator;
  return record.replayable && !reads_export && !record.traits->uninitialized &&
         !compiled_graph_paged && !generator_moved;
}

void EngineBridge::AfterOp(OpRecord&& record) {
  lock_.EndLend();
  struct Release {
    EngineBridge* self;
    ~Release() {
      self->current_.plan.spec_impl.clear();  // its references must not outlive the op (a storage's death is its use count)
      self->ReleaseSideHolds();
      self->Unlock();
    }
  } release{this};
  if (options_.next != nullptr) options_.next->AfterOpLent(record);
  if (plan_ != nullptr) plan_->Record(record);
  if (!current_.active) return;
  current_.active = false;
  if (policy_->UsesWindows()) memory_->SetPlacementForThisThread(Placement::kLow);
  ++stats_.ops;
  const OpTraits& traits = *record.traits;
  current_.PlanOutputs(record, entries_);
  const std::vector<OutputSpec>& specs = current_.plan.specs;
  const std::int64_t cost = std::max<std::int64_t>(
      1, options_.estimated_costs ? EstimatedCostNs(record) : static_cast<std::int64_t>(record.duration_ns));
  absl::StatusOr<std::span<const TensorId>> outs = engine_->EndOp(current_.op, specs, cost);
  if (!outs.ok()) Throw(outs.status());
  std::vector<TensorId>& out_tensors = current_.plan.out_tensors;
  out_tensors.assign(outs->begin(), outs->end());
  if (plan_ != nullptr) NotePlannedOp(traits.name, specs, out_tensors);
  const bool generator_moved = current_.GeneratorMoved();
  if (generator_moved) CompositeAttempt::NoteGeneratorMoved();  // a composite around it cannot run again
  const bool replayable = Replayable(record, generator_moved);
  // What the kept record will say (ReplayOp), gathered in vectors kept between ops: the ReplayOp is made only for
  // a record that is kept, with the record moved into it once.
  current_.plan.output_storage.assign(record.outputs.size(), kNoIndex);
  current_.plan.in_place.clear();
  bool keep = false;
  for (std::size_t j = 0; j < specs.size(); ++j) {
    keep |= current_.plan.spec_output[j] >= 0 ? RegisterFreshOutput(record, j, replayable)
                                              : RegisterInPlaceOutput(record, j, replayable);
  }
  if (!record.hidden_copies.empty()) AdoptRemainingCopies(record);
  if (keep) KeepRecord(std::move(record));
  ApplyExportsFromInsideOp();  // after the readers are linked: a writable export pins what read it, this op too
}

// An evictable result of a backward-pass op (a gradient, or one accumulated in place) goes last (header: Backward).
void EngineBridge::DeferIfBackward(const OpRecord& record, TensorId t) {
  if (!record.in_backward) return;
  engine_->Defer(t);
  ++stats_.deferred_outputs;
}

bool EngineBridge::RegisterFreshOutput(const OpRecord& record, std::size_t j, bool replayable) {
  const TensorId t = current_.plan.out_tensors[j];
  const StorageIndex s = engine_->StorageOf(t);
  const c10::intrusive_ptr<c10::StorageImpl>& impl = current_.plan.spec_impl[j];
  Entry& entry = entries_.Add(impl);
  entry.root = t;
  entry.from_backward = record.in_backward;
  links_.SetOwner(s, impl.get());
  executor_.SetHome(s, impl);
  if (replayable && EvictableMemory(*memory_, *impl)) {
    executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/true);
    current_.plan.output_storage[current_.plan.spec_output[j]] = s;
    DeferIfBackward(record, t);
    return true;
  }
  engine_->Pin(t);
  NotePinned(impl.get());
  entry.pinned = true;
  entry.blank = record.traits->uninitialized;
  ++stats_.pinned_outputs;
  return false;
}

bool EngineBridge::RegisterInPlaceOutput(OpRecord& record, std::size_t j, bool replayable) {
  const TensorId t = current_.plan.out_tensors[j];
  const StorageIndex s = engine_->StorageOf(t);
  const c10::intrusive_ptr<c10::StorageImpl>& impl = current_.plan.spec_impl[j];
  // The StorageImpl now holds the new version t; the old one has no home. (A blank storage overwritten entirely left
  // the engine in BeforeOp: t is simply a fresh value in it.)
  const int k = -1 - current_.plan.spec_output[j];
  Entry& entry = entries_.At(impl.get());
  if (!current_.overwrite[k] && !AdoptHiddenCopy(record, k, entry.root)) {
    const TensorId old = entry.root;
    executor_.ClearHome(engine_->StorageOf(old));
    links_.ClearOwner(engine_->StorageOf(old));
    engine_->Release(old);
  }
  entry.root = t;
  entry.from_backward = record.in_backward;
  links_.SetOwner(s, impl.get());
  executor_.SetHome(s, impl);
  if (entry.pinned) {  // a constant written in place stays a constant (the engine pinned it)
    if (current_.Resized(record, k)) {  // t is a fresh value (PlanOutputs): in other memory, of another size
      engine_->Pin(t);
      executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/false);
    }
    return false;
  }
  entry.in_place_writes = current_.overwrite[k] ? 0 : entry.in_place_writes + 1;  // an overwrite starts afresh
  if (replayable && EvictableMemory(*memory_, *impl) && !current_.Resized(record, k) &&
      entry.in_place_writes <= kLongestReplayedInPlaceChain) {
    executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/true);
    current_.plan.in_place.emplace_back(k, s);
    DeferIfBackward(record, t);
    return true;
  }
  engine_->Pin(t);
  NotePinned(impl.get());
  entry.pinned = true;
  executor_.SetOwner(AddressOf(*impl), s, /*evictable=*/false);
  ++stats_.pinned_outputs;
  return false;
}

void EngineBridge::KeepRecord(OpRecord&& record) {
  std::unique_ptr<ReplayOp> replay = records_.Make(std::move(record));
  HoldRecordRefs(*replay, current_.input_entries);
  replay->output_storage.assign(current_.plan.output_storage.begin(), current_.plan.output_storage.end());
  replay->in_place.assign(current_.plan.in_place.begin(), current_.plan.in_place.end());
  replay->inputs.assign(current_.inputs.begin(), current_.inputs.end());
  replay->written.assign(current_.written.begin(), current_.written.end());
  replay->overwritten.assign(current_.overwrite.begin(), current_.overwrite.end());
  replay->side_written.clear();  // a reused ReplayOp (RecordStore::Make) keeps its vectors
  for (std::size_t k = 0; k < current_.inputs.size(); ++k) {
    if (current_.inputs[k] == kNoIndex && current_.written[k] && !current_.overwrite[k]) {
      replay->side_written.emplace_back(static_cast<int>(k), replay->record.input_storages[k]->nbytes());
    }
  }
  for (const TensorId t : current_.inputs) {
    if (t != kNoIndex) links_.AddReader(engine_->StorageOf(t), current_.op);
  }
  executor_.AddOp(current_.op, std::move(replay));
  records_.Keep(current_.op);
}

void EngineBridge::OpFailed(OpRecord& record) noexcept {
  lock_.EndLend();
  if (current_.active) {
    engine_->AbortOp(current_.op);
    current_.active = false;
    for (std::size_t k = 0; k < current_.written.size(); ++k) {
      if (!current_.written[k]) continue;
      const c10::intrusive_ptr<c10::StorageImpl>& impl = record.input_storages[k];
      Entry& entry = entries_.At(impl.get());
      // A blank storage the op was to overwrite left the engine in BeforeOp: it is a constant again.
      if (current_.overwrite[k]) {
        AdoptAsConstant(entry, impl);
        continue;
      }
      // Any other storage the kernel wrote before it failed holds what the kernel left there: part of its writes
      // (scatter_ or index_put_ with an out-of-range index write the elements before it), or other memory of another
      // size (an out= argument that index_select resized before it checked its indices). A replay could reproduce
      // neither: the old value loses its home and what the storage holds now is a constant.
      if (entry.pinned && !current_.Resized(record, k)) continue;  // a constant of the same size: as the engine has it
      const StorageIndex old = engine_->StorageOf(entry.root);
      executor_.ClearHome(old);
      links_.ClearOwner(old);
      engine_->Release(entry.root);
      AdoptAsConstant(entry, impl);
      executor_.SetOwner(AddressOf(*impl), engine_->StorageOf(entry.root), /*evictable=*/false);
    }
  }
  ReleaseSideHolds();
  current_.exports_inside.clear();  // the op's outputs are gone; its inputs are as before it
  if (policy_->UsesWindows()) memory_->SetPlacementForThisThread(Placement::kLow);
  if (options_.next != nullptr) options_.next->OpFailed(record);
  Unlock();
}

void EngineBridge::AdoptAsConstant(Entry& entry, const c10::intrusive_ptr<c10::StorageImpl>& impl) {
  entry.root = engine_->AdoptConstant(static_cast<std::int64_t>(impl->nbytes()), AddressOf(*impl), "constant");
  entry.pinned = true;
  links_.SetOwner(engine_->StorageOf(entry.root), impl.get());
  executor_.SetHome(engine_->StorageOf(entry.root), impl);
}

bool EngineBridge::RetryAfterOutOfMemory(OpRecord& record) {
  if (!current_.active) return false;
  // An op not known to be random that drew from the default generator before failing would draw other numbers.
  if (current_.GeneratorMoved()) return false;
  lock_.EndLend();
  executor_.SetRunningOp(nullptr);  // its kernel has unwound: nothing reads its inputs until it runs again
  const absl::StatusOr<bool> retry = engine_->MakeHoleForRetry();
  executor_.SetRunningOp(&record);
  lock_.BeginLend();
  if (!retry.ok()) Throw(retry.status());  // a failed move, not the out-of-memory it was for (the hook cleans up)
  if (*retry) ++stats_.retried_ops;
  return *retry;
}

bool EngineBridge::RetryCompositeAfterOutOfMemory() {
  std::lock_guard<EngineLock> lock(lock_);
  const EngineLock::LendPause pause(lock_);  // a composite run from a Python mode's handler inside an op's kernel
  if (retired_.load(std::memory_order_acquire)) return false;
  const absl::StatusOr<bool> retry = engine_->MakeHoleForRetry();
  if (!retry.ok()) Throw(retry.status());  // a failed move, not the out-of-memory it was for
  if (*retry) ++stats_.retried_composites;
  return *retry;
}

absl::StatusOr<bool> EngineBridge::MakeRoom(Arena& arena, std::size_t bytes) {
  if (retired_.load(std::memory_order_acquire)) return false;
  EngineLock::RoomAccess access(lock_);  // waits unless this thread holds the lock or may borrow it (header)
  if (retired_.load(std::memory_order_acquire)) return false;
  stats_.borrowed_room += access.borrowed_from_another_thread();
  // The onset of pressure: storages that died since the last sweep of the unheld list are gone from the arena, but
  // the engine still counts them; it learns now, so that its choice is among the living (a dead victim frees
  // nothing, and the arena gives up after rounds that free nothing). Safe in any state of the engine, a replay's
  // included: no kept record reads an unheld storage, so no replay needs one. Not from inside a sweep (a release
  // that brings a storage back to pin it may need room).
  if (ops_since_unheld_sweep_ > 0 && !entries_.sweeping()) SweepUnheld();
  room_made_since_unheld_sweep_ = true;  // the next op sweeps both lists: pressure goes on, as a rule
  return engine_->MakeRoom(arena, bytes);
}

std::string EngineBridge::DescribeMemory() {
  EngineLock::RoomAccess access(lock_);
  return engine_->DescribeMemory();
}

absl::Status EngineBridge::Retire() {
  std::lock_guard<EngineLock> lock(lock_);
  absl::Status status = MaterializeLive();
  retired_.store(true, std::memory_order_release);
  return status;
}

std::int64_t EngineBridge::HeldReferences(const c10::StorageImpl* storage) {
  std::lock_guard<EngineLock> lock(lock_);
  const Entry* entry = entries_.Find(storage);
  return entry == nullptr ? 0 : entry->record_refs;
}

BridgeStats EngineBridge::Stats() {
  std::lock_guard<EngineLock> lock(lock_);
  BridgeStats stats = stats_;
  stats.engine = engine_->stats();
  stats.engine_tables = engine_->tables();
  stats.unknown_arena_bytes = engine_->UnknownArenaBytes();
  stats.executor = executor_.stats();
  if (tier_ != nullptr) stats.host_tier = tier_->stats();
  stats.kept_records = static_cast<std::int64_t>(records_.kept());
  stats.tracked_storages = static_cast<std::int64_t>(entries_.size());
  if (plan_ != nullptr) stats.plan = plan_->Stats();
  return stats;
}

}  // namespace remat::integration