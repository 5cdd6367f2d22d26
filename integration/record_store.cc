#include "integration/record_store.h"

#include <utility>

namespace remat::integration {

std::unique_ptr<ReplayOp> RecordStore::Make(OpRecord&& record) {
  if (spares_.empty()) return std::make_unique<ReplayOp>(std::move(record));
  std::unique_ptr<ReplayOp> replay = std::move(spares_.back());
  spares_.pop_back();
  replay->record = std::move(record);  // the other fields are assigned by whoever fills it
  return replay;
}

void RecordStore::Recycle(std::unique_ptr<ReplayOp> replay) {
  OpRecord& r = replay->record;
  RecycleAliases(r.arguments);  // the hook reuses the aliases' TensorImpls
  if (spares_.size() >= kMaxSpares) return;  // destroyed here
  // Its references go now, as if it were destroyed; the rest is overwritten when it is reused.
  r.input_storages.clear();
  r.outputs.clear();
  r.rng.reset();
  spares_.push_back(std::move(replay));
}

void RecordStore::ClearDropped() {
  for (const OpId op : dropped_ops_) dropped_[op] = 0;
  dropped_ops_.clear();
}

}  // namespace remat::integration
