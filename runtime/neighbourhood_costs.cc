#include "runtime/neighbourhood_costs.h"

namespace remat {

void NeighbourhoodCosts::AddSlot() {
  parents_.emplace_back();
  children_.emplace_back();
  state_.push_back(0);
  costs_.push_back(0);
  node_of_.push_back(-1);
  weight_mark_.push_back(kOut);
  if (regions_) {
    fwd_.emplace_back();
    rev_.emplace_back();
  }
}

void NeighbourhoodCosts::ResetSlot(Slot s) {
  state_[s] = 0;
  costs_[s] = 0;
  node_of_[s] = -1;
  weight_mark_[s] = kOut;
}

void NeighbourhoodCosts::FreeSlot(Slot s) {
  if (eq_classes_) LeaveNode(s);
  if (regions_) {
    fwd_[s] = Region();
    rev_[s] = Region();
  }
  node_of_[s] = -1;
  state_[s] = kRegionDead;  // walks that still reach it (a region built before it died) ignore it
  costs_[s] = 0;
  weight_mark_[s] = kOut;
}

void NeighbourhoodCosts::AddEdge(Slot child, Slot parent) {
  // Repeats change nothing in the walks (marks), so skip the obvious ones (same input twice, many views).
  auto add = [](std::vector<Slot>& v, Slot x) {
    for (std::size_t k = v.size(), n = 0; k > 0 && n < 4; --k, ++n) {
      if (v[k - 1] == x) return;
    }
    v.push_back(x);
  };
  add(parents_[child], parent);
  add(children_[parent], child);
  Touch(child);
  Touch(parent);
}

void NeighbourhoodCosts::SetMaterial(Slot s, bool material) {
  Touch(s);
  state_[s] = static_cast<std::uint8_t>((state_[s] & ~kRegionMaterial) | (material ? kRegionMaterial : 0));
}

void NeighbourhoodCosts::MarkDead(Slot s) {
  Touch(s);
  state_[s] |= kRegionDead;
}

void NeighbourhoodCosts::NewStorage(Slot s) {
  if (eq_classes_) node_of_[s] = AddNode(s, 0);  // placeholder until first computed
}

void NeighbourhoodCosts::Resident(Slot s, std::int64_t compute, std::size_t pool_size) {
  if (!eq_classes_) return;
  if (node_of_[s] >= 0) {
    eq_.Value(node_of_[s]) -= compute;
    TouchClass(node_of_[s], pool_size);
  }
  LeaveNode(s);
  Touch(s);
}

void NeighbourhoodCosts::LeaveNode(Slot s) {
  if (node_of_[s] < 0) return;
  --node_live_[eq_.Find(node_of_[s])];
  node_of_[s] = -1;
}

std::int32_t NeighbourhoodCosts::AddNode(Slot s, std::int64_t value) {
  const std::int32_t node = eq_.Add(value);
  node_storage_.push_back(s);
  node_members_.emplace_back(1, node);
  node_live_.push_back(1);
  return node;
}

void NeighbourhoodCosts::MergeNodes(std::int32_t joining, std::int32_t into) {
  const std::int32_t l = eq_.Find(joining), r = eq_.Find(into);
  if (l == r) return;
  Members& big = node_members_[r];
  Members& small = node_members_[l];
  if (small.size() > big.size()) big.swap(small);
  big.insert(big.end(), small.begin(), small.end());
  Members().swap(small);
  node_live_[r] += node_live_[l];
  eq_.Merge(joining, into);  // r stays the root
}

void NeighbourhoodCosts::Touch(Slot x) {
  if (!weights_ || all_dirty_) return;  // every weight is recomputed at the next choice anyway
  MarkDirty(x);
  for (Slot n : parents_[x]) MarkDirty(n);
  for (Slot n : children_[x]) MarkDirty(n);
}

void NeighbourhoodCosts::TouchClass(std::int32_t node, std::size_t pool_size) {
  if (!weights_ || all_dirty_) return;
  const std::int32_t root = eq_.Find(node);
  const std::size_t live = static_cast<std::size_t>(node_live_[root]);
  if (live > kClassTouchLimit || live * 4 > pool_size) {
    all_dirty_ = true;
    return;
  }
  // Only the current nodes matter: a storage that left its node (resident again) never returns to it, and EqSum
  // only reaches classes through current nodes. Drop the others for good (each node once: amortized O(1)).
  Members& members = node_members_[root];
  members.erase(std::remove_if(members.begin(), members.end(),
                               [&](std::int32_t x) { return node_of_[node_storage_[x]] != x; }),
                members.end());
  for (std::int32_t x : members) Touch(node_storage_[x]);
}

void NeighbourhoodCosts::JoinedPool(Slot s, std::size_t storage_count) {
  if (!weights_) return;
  weight_mark_[s] = kDirty;
  if (dirty_.size() > 2 * storage_count) {  // no choice for a long while: recompute everything instead
    dirty_.clear();
    all_dirty_ = true;
  }
  if (!all_dirty_) dirty_.push_back(s);
}

}  // namespace remat
