#include "runtime/sim_executor.h"

#include "absl/strings/str_cat.h"

namespace remat {

absl::Status SimExecutor::Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) {
  if (arena_ == nullptr) return absl::OkStatus();
  Placement placement = (!partition_ || engine.OpCostly(op)) ? Placement::kLow : Placement::kHigh;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    const std::uint32_t s = fresh[i];
    engine.NoteAllocation();
    absl::StatusOr<std::uintptr_t> address =
        arena_->Allocate(static_cast<std::size_t>(engine.StorageBytes(s)), OwnerId{s} + 1, placement);
    if (!address.ok()) {
      for (std::size_t j = 0; j < i; ++j) (void)arena_->Free(engine.StorageAddress(fresh[j]));  // all or nothing
      return absl::ResourceExhaustedError(absl::StrCat("out of memory running '", std::string(engine.OpName(op)),
                                                       "': ", address.status().message()));
    }
    engine.SetAddress(s, *address);
  }
  return absl::OkStatus();
}

void SimExecutor::Evict(Engine& engine, std::uint32_t storage) {
  if (arena_ == nullptr) return;
  (void)arena_->Free(engine.StorageAddress(storage));
}

}  // namespace remat
