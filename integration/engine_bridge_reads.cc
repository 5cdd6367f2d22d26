// EngineBridge, its part in ops recorded by another device's bridge (engine_bridge.h, BeginRead; device_router.h,
// "Cross-device ops"): the storages of this device that such an op reads are brought back and locked while it runs.
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

bool EngineBridge::HoldsOutOfMemory(const c10::StorageImpl* storage) {
  std::lock_guard<EngineLock> lock(lock_);
  const Entry* entry = entries_.Find(storage);
  if (entry == nullptr || entry->released) return false;
  return !engine_->Defined(entry->root) || engine_->Paged(engine_->StorageOf(entry->root));
}

}  // namespace remat::integration
