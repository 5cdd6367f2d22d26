#include "runtime/sim_executor.h"

#include "absl/strings/str_cat.h"

namespace remat {

absl::Status SimExecutor::Execute(Engine& engine, OpId op, bool replay, std::span<const std::uint32_t> fresh) {
  if (replay) {
    for (const std::uint32_t s : fresh) totals_.rematerialized_bytes += engine.StorageBytes(s);
    if (replay_log_ != nullptr) replay_log_->push_back(static_cast<std::int64_t>(op));
  }
  if (arena_ == nullptr) return absl::OkStatus();
  const Placement placement = PlacementFor(engine, op);
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    const std::uint32_t s = fresh[i];
    engine.NoteAllocation();
    absl::StatusOr<std::uintptr_t> address =
        arena_->Allocate(static_cast<std::size_t>(engine.StorageBytes(s)), OwnerId{s} + 1, placement);
    if (!address.ok()) {
      for (std::size_t j = 0; j < i; ++j) (void)arena_->Free(engine.StorageAddress(fresh[j]));  // all or nothing
      return OutOfMemory(engine, op, address.status());
    }
    engine.SetAddress(s, *address);
  }
  return absl::OkStatus();
}

Placement SimExecutor::PlacementFor(const Engine& engine, OpId op) const {
  return (!partition_ || engine.OpCostly(op)) ? Placement::kLow : Placement::kHigh;
}

absl::Status SimExecutor::OutOfMemory(const Engine& engine, OpId op, const absl::Status& status) {
  return absl::ResourceExhaustedError(
      absl::StrCat("out of memory running '", std::string(engine.OpName(op)), "': ", status.message()));
}

absl::StatusOr<std::uintptr_t> SimExecutor::AllocateForKernel(Engine& engine, OpId op, std::int64_t bytes) {
  absl::StatusOr<std::uintptr_t> address =
      arena_->Allocate(static_cast<std::size_t>(bytes), kNoOwner, PlacementFor(engine, op));
  if (!address.ok()) return OutOfMemory(engine, op, address.status());
  return address;
}

void SimExecutor::FreeBlock(std::uintptr_t address) { (void)arena_->Free(address); }

void SimExecutor::Adopt(Engine& engine, std::uint32_t storage) {
  if (arena_ == nullptr || engine.StorageAddress(storage) == 0) return;
  (void)arena_->SetOwner(engine.StorageAddress(storage), OwnerId{storage} + 1);
}

void SimExecutor::Evict(Engine& engine, std::uint32_t storage) {
  (engine.StorageExternalRefs(storage) > 0 ? totals_.evicted_bytes : totals_.released_bytes) +=
      engine.StorageBytes(storage);
  Free(engine, storage);
}

void SimExecutor::DropPinned(Engine& engine, std::uint32_t storage) {
  totals_.released_bytes += engine.StorageBytes(storage);
  Free(engine, storage);
}

void SimExecutor::Free(Engine& engine, std::uint32_t storage) {
  if (arena_ == nullptr) return;
  (void)arena_->Free(engine.StorageAddress(storage));
}

absl::Status SimExecutor::PageOut(Engine& engine, std::uint32_t storage) {
  Free(engine, storage);
  return absl::OkStatus();
}

absl::StatusOr<bool> SimExecutor::Relocate(Engine& engine, std::uint32_t s, AddressRange avoid) {
  if (arena_ == nullptr) return false;
  const auto bytes = static_cast<std::size_t>(engine.StorageBytes(s));
  for (const Placement placement : {Placement::kTop, Placement::kLow}) {
    absl::StatusOr<std::uintptr_t> to = arena_->TryAllocate(bytes, OwnerId{s} + 1, placement);
    if (!to.ok()) return false;
    if (avoid.Overlaps(*to, arena_->Block(*to)->size)) {
      (void)arena_->Free(*to);
      continue;
    }
    (void)arena_->Free(engine.StorageAddress(s));
    engine.SetAddress(s, *to);
    return true;
  }
  return false;
}

absl::StatusOr<bool> SimExecutor::Slide(Engine& engine, std::uint32_t s, std::uintptr_t to) {
  if (arena_ == nullptr) return false;
  if (absl::Status moved = arena_->Move(engine.StorageAddress(s), to); !moved.ok()) return moved;
  engine.SetAddress(s, to);
  return true;
}

absl::Status SimExecutor::PageIn(Engine& engine, std::uint32_t s) {
  if (arena_ == nullptr) return absl::OkStatus();
  const bool low = !partition_ || engine.OpCostly(engine.ProducerOf(engine.StorageRoot(s)));
  absl::StatusOr<std::uintptr_t> address = arena_->Allocate(static_cast<std::size_t>(engine.StorageBytes(s)),
                                                            OwnerId{s} + 1, low ? Placement::kLow : Placement::kHigh);
  if (!address.ok()) return absl::ResourceExhaustedError(address.status().message());
  engine.SetAddress(s, *address);
  return absl::OkStatus();
}

}  // namespace remat
