#include "runtime/eq_classes.h"

namespace remat {

std::int32_t EqClasses::Find(std::int32_t node) {
  std::int32_t root = node;
  while (nodes_[root].parent >= 0) root = nodes_[root].parent;
  while (nodes_[node].parent >= 0) {
    std::int32_t next = nodes_[node].parent;
    nodes_[node].parent = root;
    node = next;
  }
  return root;
}

void EqClasses::Merge(std::int32_t joining, std::int32_t into) {
  std::int32_t l = Find(joining), r = Find(into);
  if (l == r) return;
  nodes_[l].parent = r;
  nodes_[r].value += nodes_[l].value;
}

}  // namespace remat
