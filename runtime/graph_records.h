// GraphRecords: the engine's records of what ran. An op (its cost, name, input and output tensors), a tensor (one
// output of an op: its storage, whether it is defined now, its references), a storage (bytes, compute, residency,
// locks, pins, address, the tensors it backs). Records live in flat tables indexed by dense ids (OpId, TensorId,
// StorageIndex); ids of recycled records (engine_recycle.cc) are reused before a table grows, and a reused slot
// starts as a fresh record. The op input/output lists live in two flat arrays (Inputs/Outputs); a freed op leaves
// a hole there (io_garbage) until the engine compacts them. Op names are interned.
//
// Plain data with the slot bookkeeping: what a record's fields mean for eviction is the engine's contract
// (engine.h); the eviction pool and the neighbourhood costs keep their own per-storage state beside these tables.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "runtime/engine.h"

namespace remat {

struct GraphRecords {
  struct Op {
    std::int64_t cost = 0;
    std::int64_t total_size = 0;
    std::uint32_t in_begin = 0, in_count = 0;
    std::uint32_t out_begin = 0, out_count = 0;
    std::uint32_t name = 0;  // index into names
    bool costly = false;
    // No output can ever be recomputed by it (each is dead or pinned): its input list is dropped (Recycle).
    bool inert = false;
    bool free = false;  // recycled: the slot waits for reuse
  };
  struct Tensor {
    OpId op = 0;
    std::uint32_t index = 0;
    StorageIndex storage = 0;
    std::int64_t size = 0;  // the op's size for this output (0 for views)
    std::int32_t ext_refs = 0;
    bool defined = false;
    bool alias = false;
    bool paged_defined = false;  // defined when its storage was paged out (restored on page-in)
    std::int32_t consumers = 0;  // ops (not inert) that list it as an input
  };
  struct Storage {
    std::int64_t size = 0;
    std::int64_t compute = 0;
    std::int64_t last_access = 0;
    std::int32_t locks = 0;
    std::int32_t ext_refs = 0;
    std::int32_t holds = 0;  // Hold: locked, and not moved either
    bool material = false;
    bool computed = false;  // has been computed at least once (evicted vs never produced)
    bool pinned = false;
    bool dead = false;  // free_dead: no reference and nothing alive can ever need it; out of the graph for good
    bool has_address = false;
    bool paged = false;     // on the second tier (not material; counts as material for regions and classes)
    bool constant = false;  // no producer (Constant, AdoptConstant, in-place write of a constant)
    bool deferred = false;  // Defer, or small (last_resort_bytes): out of the pool (in deferred_list) until it runs dry
    bool fixed = false;     // Fix: its address is known outside the engine; never moved, paged out or evicted
    // Released with its memory kept for a replay that reads it (Engine::Release): in released_list, dropped first.
    bool released_resident = false;
    bool free = false;      // recycled (also dead): the slot waits for reuse
    std::int64_t ready_at = 0;  // paged in: when the copy ends
    std::uintptr_t address = 0;
    std::vector<TensorId> tensors;
  };

  std::vector<Op> ops;
  std::vector<TensorId> op_inputs, op_outputs;
  std::vector<Tensor> tensors;
  std::vector<Storage> storages;
  std::vector<std::string> names;
  absl::flat_hash_map<std::string, std::uint32_t> name_ids;
  // Slots of recycled ops, tensors and storages, reused before the tables grow; entries of op_inputs/op_outputs
  // no op uses any more.
  std::vector<OpId> free_ops;
  std::vector<TensorId> free_tensors;
  std::vector<StorageIndex> free_storages;
  std::size_t io_garbage = 0;

  // A new op's (tensor's) slot, reused if one is free, its record reset.
  OpId NewOpSlot() {
    if (free_ops.empty()) {
      ops.emplace_back();
      return static_cast<OpId>(ops.size() - 1);
    }
    const OpId o = free_ops.back();
    free_ops.pop_back();
    ops[o] = Op{};
    return o;
  }
  TensorId NewTensorSlot() {
    if (free_tensors.empty()) {
      tensors.emplace_back();
      return static_cast<TensorId>(tensors.size() - 1);
    }
    const TensorId t = free_tensors.back();
    free_tensors.pop_back();
    tensors[t] = Tensor{};
    return t;
  }
  // A new storage's slot, reused if one is free, its record reset; `grew` says the table grew (the engine's parts
  // then add a slot too).
  StorageIndex TakeStorageSlot(bool& grew) {
    grew = free_storages.empty();
    if (grew) {
      storages.emplace_back();
      return static_cast<StorageIndex>(storages.size() - 1);
    }
    const StorageIndex s = free_storages.back();
    free_storages.pop_back();
    ResetStorage(s);
    return s;
  }
  // A fresh record in slot s; its tensor list keeps its capacity (no allocation per new storage once slots recycle).
  void ResetStorage(StorageIndex s) {
    std::vector<TensorId> kept = std::move(storages[s].tensors);
    kept.clear();
    storages[s] = Storage{};
    storages[s].tensors = std::move(kept);
  }

  std::span<const TensorId> Inputs(const Op& op) const { return {op_inputs.data() + op.in_begin, op.in_count}; }
  std::span<const TensorId> Outputs(const Op& op) const {
    return {op_outputs.data() + op.out_begin, op.out_count};
  }

  // The id of an op name, interned on first use.
  std::uint32_t Name(std::string_view n) {
    auto it = name_ids.find(absl::string_view(n.data(), n.size()));
    if (it != name_ids.end()) return it->second;
    std::uint32_t id = static_cast<std::uint32_t>(names.size());
    names.emplace_back(n);
    name_ids.emplace(names.back(), id);
    return id;
  }
};

}  // namespace remat
