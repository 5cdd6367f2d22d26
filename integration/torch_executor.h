// TorchExecutor: the engine's Executor (runtime/executor.h) over real PyTorch storages (DESIGN.md, "PyTorch
// integration"). The engine decides what to replay and evict; this class does it with the op records the dispatch
// hook captured (dispatch_hook.h) and with storage_eviction.h.
//
// Where an engine storage's bytes live ("holder"):
//   - its home: the user's c10::StorageImpl (held weakly), while that StorageImpl still holds this version of the
//     data. Evict swaps the home's DataPtr for an empty one (EvictStorage); a replay moves the result's DataPtr
//     back into the home (RestoreStorage), so views and autograd-saved tensors keep working;
//   - or a shadow: a StorageImpl only remat sees (held strongly). Used for a version no user tensor can see any
//     more (the old value of an in-place write, a storage whose StorageImpl died) when a replay needs it as an
//     input. Evicting a shadow drops it.
//
// Execute(engine, op, replay, fresh): builds a fresh argument stack from the record (ReplayArguments) and points
// every tensor argument at the holder of the engine storage it read when the op first ran; arguments the op
// writes (in-place self, out=) get a private copy instead, so a replay never writes into memory the user (or
// another version) owns; constants it writes on the side (batch norm's running stats, op_effects.h) and arguments
// it overwrites entirely (ReplayOp::overwritten) get a fresh buffer of the same size. Runs the op with ReplayWith
// (key excluded, below autograd and ADInplaceOrView, captured RNG and autocast state), then, for each storage in
// `fresh`, moves the result into its home (or keeps it as a shadow) and reports the address with
// Engine::SetAddress and the arena owner (storage + 1) for window policies. Results of storages not in `fresh` (still resident) are dropped. A replay
// that runs out of memory before it delivers anything asks Engine::MakeHoleForRetry and runs again.
//
// Paging (runtime/executor.h, "Paging"), when a HostTier (host_tier.h) is set:
//   PageOut(engine, s) copies the holder's bytes into the tier under key s, then drops the memory exactly as Evict
//     does (EvictStorage on the home; a shadow is released). If the tier refuses the copy (budget, I/O) or the
//     memory cannot be dropped, the tier copy is released again and s stays resident with its bytes.
//   PageIn(engine, s) allocates nbytes in the device memory (the arena: the allocation may call MakeRoom), loads
//     the tier copy into it, byte-identical, and moves it into the home with RestoreStorage (or keeps it as a
//     shadow when no home wants it, as Deliver does); reports the address with Engine::SetAddress and restores the
//     arena owner the block had when it was paged out (s + 1, or none for a pinned storage). Only then is the tier
//     copy released: a failed allocation or load keeps it.
//   DropPaged(engine, s) releases the tier copy.
// When the device memory pages itself (DeviceMemory::pager(), CUDA: pinned host pages and a copy stream), the tier
// holds nothing and the bytes go through the pager instead, asynchronously: PageOut starts the copy and drops the
// memory at once (the block is reused only after the copy has read it); PageIn allocates, moves the block into the
// home and starts the copy into it, then orders the current stream after the copy (WaitForPageIn) before it returns;
// PageInAhead (a prefetch) leaves that wait to WillRead, called before the first op that reads the storage, or to
// any other call that touches it (evict, page out, relocate, slide, Clear). The host never waits for a page copy.
//
// Memory: every allocation, copy and arena operation goes through a DeviceMemory (device_memory.h): the CPU arena by
// default, a CUDA device's arena when the bridge runs on CUDA. With memory that host code cannot read, page copies
// go through a staging buffer in host memory.
//
// Not thread-safe: the engine bridge serializes every call (engine_bridge.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "integration/cpu_device_memory.h"
#include "integration/device_memory.h"
#include "integration/dispatch_hook.h"
#include "integration/engine_lock.h"
#include "integration/host_tier.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace remat::integration {

inline constexpr std::uint32_t kNoIndex = std::numeric_limits<std::uint32_t>::max();

// One recorded op the engine may replay.
struct ReplayOp {
  explicit ReplayOp(OpRecord&& r) : record(std::move(r)) {}
  OpRecord record;
  // Per record.input_storages: the engine tensor it was when the op ran, or kNoIndex for a written argument that
  // was not given to the engine (a constant the op writes but does not return: side_written).
  absl::InlinedVector<TensorId, 4> inputs;  // inline, as the per-record vectors below: no allocation per kept op
  // Constants the op writes on the side, which its outputs ignore (op_effects.h, 3): (index into
  // record.input_storages, its bytes when the op ran). Replays give the op that many fresh bytes in its place (the
  // record's StorageImpl may be evicted by then, with no bytes).
  absl::InlinedVector<std::pair<int, std::size_t>, 1> side_written;
  // Per record.input_storages: the op writes it (replays write a private copy).
  absl::InlinedVector<bool, 4> written;
  // Per record.input_storages: the op overwrites all of it without reading it (a fill, a random fill, an out=
  // argument) and its old contents were uninitialized (aten::empty): replays write a fresh uninitialized buffer.
  absl::InlinedVector<bool, 4> overwritten;
  // Per record.outputs: the engine storage the op produced there, or kNoIndex (a view, a pinned output).
  absl::InlinedVector<StorageIndex, 2> output_storage;
  // In-place writes the engine tracks: (index into record.input_storages, engine storage of the new value).
  absl::InlinedVector<std::pair<int, StorageIndex>, 1> in_place;
  // Per record.input_storages: the strong references this record holds on it (its own and one per argument tensor
  // over it), as the bridge counted them when it kept the record; empty when it counted them otherwise.
  absl::InlinedVector<std::int32_t, 4> input_refs;

  // The engine storage of the new value of input k written in place, or kNoIndex.
  StorageIndex in_place_storage(int k) const {
    for (const auto& [input, storage] : in_place) {
      if (input == k) return storage;
    }
    return kNoIndex;
  }
  // The bytes of side-written input k (side_written), or 0.
  std::size_t side_written_bytes(int k) const {
    for (const auto& [input, bytes] : side_written) {
      if (input == k) return bytes;
    }
    return 0;
  }
};

struct ExecutorStats {
  std::int64_t replays = 0;
  std::int64_t replay_ns = 0;        // wall time in Execute (copies and replayed kernels)
  std::int64_t retried_replays = 0;  // replays run again after running out of memory (Engine::MakeHoleForRetry)
  std::int64_t evictions = 0;        // storages whose memory Evict dropped
  std::int64_t shadows = 0;          // results kept as shadows (no home to restore into)
  std::int64_t empty_evictions = 0;  // Evict calls that found no memory to drop (home died, already evicted)
  std::int64_t page_outs = 0;        // copies into the host tier whose memory was then dropped
  std::int64_t page_ins = 0;
  std::int64_t page_out_ns = 0;      // wall time of PageOut (copy and drop)
  std::int64_t page_in_ns = 0;       // wall time of PageIn (allocation, including what it made room for, and copy)
};

class TorchExecutor final : public Executor {
 public:
  TorchExecutor() = default;
  TorchExecutor(const TorchExecutor&) = delete;
  TorchExecutor& operator=(const TorchExecutor&) = delete;

  // The memory storages live in (not owned; must outlive the executor). Default: the CPU allocator, no arena.
  void SetMemory(DeviceMemory* memory) { memory_ = memory; }
  // The lock the bridge holds while it calls the engine (not owned): lent while a replay's kernel runs, so that
  // its intra-op workers (or other threads) can make room (engine_lock.h). Null: nothing is lent.
  void SetLock(EngineLock* lock) { lock_ = lock; }
  // The second tier PageOut/PageIn use (not owned); null: paging is Unimplemented (the engine fails loudly).
  void SetHostTier(HostTier* tier) { tier_ = tier; }
  // The op `op` can be replayed from `replay`.
  void AddOp(OpId op, std::unique_ptr<ReplayOp> replay);
  const ReplayOp* Op(OpId op) const { return op < ops_.size() ? ops_[op].get() : nullptr; }
  // Removes op's record (nothing will replay it any more) and returns it.
  std::unique_ptr<ReplayOp> TakeOp(OpId op) { return op < ops_.size() ? std::move(ops_[op]) : nullptr; }
  // `s` now lives in `home` (weak reference) / no longer in any user StorageImpl.
  void SetHome(StorageIndex s, const c10::intrusive_ptr<c10::StorageImpl>& home);
  void ClearHome(StorageIndex s);
  // The StorageImpl holding s's bytes, or null if none (evicted with a dead home, never computed).
  c10::intrusive_ptr<c10::StorageImpl> Holder(StorageIndex s) const;
  // Sets the arena block owner of s's memory (s + 1), or clears it (pinned storages are barriers).
  void SetOwner(std::uintptr_t address, StorageIndex s, bool evictable);

  absl::Status Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) override;
  void Evict(Engine& engine, std::uint32_t storage) override;
  absl::Status PageOut(Engine& engine, std::uint32_t storage) override;
  absl::Status PageIn(Engine& engine, std::uint32_t storage) override;
  void DropPaged(Engine& engine, std::uint32_t storage) override;
  absl::Status PageInAhead(Engine& engine, std::uint32_t storage) override;
  void WillRead(Engine& engine, std::uint32_t storage) override;

  // The user op whose kernel runs now (the bridge sets it between BeforeOp and AfterOp), or nullptr: its storages
  // are in use even when they are not engine inputs.
  void SetRunningOp(const OpRecord* record) { running_op_ = record; }
  // A replay or the running user op reads or writes `impl` (its memory must not move).
  bool InUse(const c10::StorageImpl* impl) const;
  // Moves a pinned storage's bytes out of `avoid` (Executor::Relocate): a fresh block of the arena (highest hole
  // first, never asking the pressure handler: DeviceMemory::TryAllocate), a copy, and a DataPtr swap in its
  // StorageImpl.
  absl::StatusOr<bool> Relocate(Engine& engine, std::uint32_t storage, AddressRange avoid) override;
  // Slides a storage's block into the hole next to it (Executor::Slide) with DeviceMemory::Slide.
  absl::StatusOr<bool> Slide(Engine& engine, std::uint32_t storage, std::uintptr_t to) override;

  // Drops every record and shadow (the engine is going away).
  void Clear();
  // Drops what it keeps under storage ids the engine recycled (Engine::Recycle): they will name other storages.
  void Forget(const RecycledIds& ids);
  const ExecutorStats& stats() const { return stats_; }

 private:
  absl::Status ExecuteOrThrow(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh);
  void Grow(StorageIndex s);
  absl::Status Deliver(Engine& engine, StorageIndex s, const c10::intrusive_ptr<c10::StorageImpl>& source,
                       bool copy, bool evictable = true);
  absl::Status PageInStatus(Engine& engine, StorageIndex s, bool ahead);  // PageInOrThrow, errors as statuses
  absl::Status PageInOrThrow(Engine& engine, StorageIndex s, bool ahead);
  absl::Status PageInThroughPager(Engine& engine, StorageIndex s, DevicePager& pager, bool ahead);
  // Orders the current stream after s's page-in copy if a prefetch left that wait for later, and forgets the page.
  absl::Status SettlePageIn(StorageIndex s);

  CpuDeviceMemory default_memory_{nullptr};
  DeviceMemory* memory_ = &default_memory_;
  std::vector<std::unique_ptr<ReplayOp>> ops_;  // by OpId; null for ops that are never replayed
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> homes_;  // by StorageIndex
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> shadows_;     // by StorageIndex
  ExecutorStats stats_;
  std::vector<const c10::StorageImpl*> in_use_;  // storages of the replay running now
  const OpRecord* running_op_ = nullptr;
  HostTier* tier_ = nullptr;
  EngineLock* lock_ = nullptr;
  std::vector<bool> paged_evictable_;  // by StorageIndex: the arena owner its block had when paged out
  absl::flat_hash_map<StorageIndex, DevicePager::Page> device_pages_;  // paged out through the memory's pager
  absl::flat_hash_map<StorageIndex, DevicePager::Page> unwaited_;      // prefetched: copy not waited for yet
  absl::Status deferred_error_;  // a failed wait in WillRead (which cannot fail): the next call returns it
};

}  // namespace remat::integration
