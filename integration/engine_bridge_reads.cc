// EngineBridge, storages read by code it does not record itself, brought back and kept in place while that code runs:
// ops recorded by another device's bridge (engine_bridge.h, BeginRead; device_router.h, "Cross-device ops") and
// composite ops, whose kernels may read their arguments through raw pointers between the nested ops the bridge
// records (BeginComposite; dispatch_hook.h, "What the fallback does").
#include <algorithm>
#include <mutex>

#include "integration/engine_bridge.h"
#include "integration/engine_bridge_internal.h"
#include "integration/op_cost.h"

namespace remat::integration {

using bridge_internal::Throw;

void EngineBridge::BeginRead(const OpRecord& record, std::span<const int> reads) {
  lock_.lock();
  try {
    if (retired_.load(std::memory_order_acquire)) {  // being destroyed: nothing comes back or is locked any more
      current_.active = false;
      lock_.BeginLend();
      return;
    }
    engine_->NoteAllocation();
    Sweep();
    std::vector<TensorId>& inputs = current_.engine_inputs;
    inputs.clear();
    for (const int k : reads) {
      const TensorId t = EntryFor(record.input_storages[static_cast<std::size_t>(k)].get()).root;
      if (std::find(inputs.begin(), inputs.end(), t) == inputs.end()) inputs.push_back(t);
    }
    absl::StatusOr<OpId> op = engine_->BeginOp(inputs, record.traits->name);
    if (!op.ok()) Throw(op.status());
    executor_.SetRunningOp(&record);  // the kernel reads them from here: they must not move
    current_.op = *op;
    current_.active = true;
    lock_.BeginLend();
  } catch (...) {
    current_.active = false;
    Unlock();
    throw;
  }
}

void EngineBridge::EndRead(const OpRecord& record, bool failed) noexcept {
  lock_.EndLend();
  if (current_.active) {
    current_.active = false;
    if (failed) {
      engine_->AbortOp(current_.op);
    } else {
      ++stats_.ops;
      const std::int64_t cost = std::max<std::int64_t>(
          1, options_.estimated_costs ? EstimatedCostNs(record) : static_cast<std::int64_t>(record.duration_ns));
      // No outputs: EndOp only unlocks the inputs and counts the access. It fails only for an op that is not the
      // latest BeginOp, which the lock rules out; the inputs are unlocked by AbortOp then.
      if (!engine_->EndOp(current_.op, {}, cost).ok()) engine_->AbortOp(current_.op);
    }
  }
  Unlock();
}

void EngineBridge::BeginComposite(std::span<c10::StorageImpl* const> read_raw,
                                  std::span<c10::StorageImpl* const> passed_on, CompositeHold& hold) {
  std::lock_guard<EngineLock> lock(lock_);
  if (retired_.load(std::memory_order_acquire)) return;  // being destroyed: nothing is evicted or moved any more
  const std::size_t first = hold.held.size();
  auto hold_entry = [&](c10::StorageImpl* impl, bool bring_back) {
    Entry& entry = EntryFor(impl);
    if (entry.released) return;
    // Bringing back what the kernel only passes on would replay it for nothing (or for the nested op that reads it,
    // which brings it back itself): index_add's backward reads only its source's sizes (expand_as).
    if (!bring_back && (!engine_->Defined(entry.root) || engine_->Paged(engine_->StorageOf(entry.root)))) return;
    if (absl::Status status = engine_->Hold(entry.root); !status.ok()) Throw(status);
    hold.held.emplace_back(this, entry.root);
    executor_.WillRead(*engine_, engine_->StorageOf(entry.root));  // after a prefetch's copy
  };
  try {
    engine_->NoteAllocation();
    for (c10::StorageImpl* impl : read_raw) hold_entry(impl, /*bring_back=*/true);
    for (c10::StorageImpl* impl : passed_on) hold_entry(impl, /*bring_back=*/false);
  } catch (...) {
    for (std::size_t i = hold.held.size(); i-- > first;) engine_->Unhold(hold.held[i].second);
    hold.held.resize(first);
    throw;
  }
}

void EngineBridge::EndComposite(CompositeHold& hold) noexcept {
  std::lock_guard<EngineLock> lock(lock_);
  for (const auto& [bridge, t] : hold.held) {
    if (bridge == this) engine_->Unhold(t);
  }
}

bool EngineBridge::HoldsOutOfMemory(const c10::StorageImpl* storage) {
  std::lock_guard<EngineLock> lock(lock_);
  const Entry* entry = entries_.Find(storage);
  if (entry == nullptr || entry->released) return false;
  return !engine_->Defined(entry->root) || engine_->Paged(engine_->StorageOf(entry->root));
}

}  // namespace remat::integration
