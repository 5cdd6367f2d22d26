// StorageLinks: what the bridge knows per engine storage (StorageIndex), beside the engine's own records
// (engine_bridge.h, "Writes to constants", "Pruning").
//
// Contract:
//   - Owner(s): the StorageImpl (a StorageEntries key) whose current version engine storage s is, or nullptr. Set
//     when a version is registered (an op's output, an adopted constant, an in-place write), cleared when that
//     version leaves the engine or its slot is recycled.
//   - Readers(s): the kept records (ops) that read s, in the order they were kept. DropReaders takes dropped records
//     out of the lists of the storages they read, keeping the order of the rest.
//   - Both are dense tables by storage index (the engine recycles indices, so they follow the live storages); a
//     recycled storage's links go with Forget.
#pragma once

#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace remat::integration {

class StorageLinks {
 public:
  const c10::StorageImpl* Owner(StorageIndex s) const { return s < owners_.size() ? owners_[s] : nullptr; }
  void SetOwner(StorageIndex s, const c10::StorageImpl* impl) {
    if (s >= owners_.size()) owners_.resize(s + 1, nullptr);
    owners_[s] = impl;
  }
  void ClearOwner(StorageIndex s) {
    if (s < owners_.size()) owners_[s] = nullptr;
  }

  std::span<const OpId> Readers(StorageIndex s) const {
    return s < readers_.size() ? std::span<const OpId>(readers_[s]) : std::span<const OpId>();
  }
  void AddReader(StorageIndex s, OpId op) {
    if (s >= readers_.size()) readers_.resize(s + 1);
    readers_[s].push_back(op);
  }
  // Takes the ops for which dropped(op) is true out of the reader lists of `storages` (repeats allowed).
  template <typename Dropped>
  void DropReaders(std::span<const StorageIndex> storages, Dropped dropped);
  // s was recycled: no owner, no readers.
  void Forget(StorageIndex s) {
    ClearOwner(s);
    if (s < readers_.size()) ClearList(readers_[s]);
  }

 private:
  // A short list keeps its capacity for the slot's reuse; a long one (a constant every op read) gives it back.
  static void ClearList(std::vector<OpId>& list) {
    if (list.capacity() > 64) {
      std::vector<OpId>().swap(list);
    } else {
      list.clear();
    }
  }

  std::vector<const c10::StorageImpl*> owners_;
  std::vector<std::vector<OpId>> readers_;
  std::vector<std::uint8_t> seen_;  // DropReaders' scratch, per storage
};

template <typename Dropped>
void StorageLinks::DropReaders(std::span<const StorageIndex> storages, Dropped dropped) {
  if (seen_.size() < readers_.size()) seen_.resize(readers_.size(), 0);
  for (const StorageIndex s : storages) {
    if (s >= readers_.size() || seen_[s]) continue;
    seen_[s] = 1;
    std::vector<OpId>& list = readers_[s];
    std::erase_if(list, dropped);
    if (list.empty()) ClearList(list);
  }
  for (const StorageIndex s : storages) {
    if (s < seen_.size()) seen_[s] = 0;
  }
}

}  // namespace remat::integration
