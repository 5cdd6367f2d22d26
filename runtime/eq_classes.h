// EqClasses: the union-find behind h_DTR^eq (DESIGN.md; the prototype's EqClassNode). Each evicted storage gets a
// node carrying its cost; evicting a storage merges its class with its evicted neighbours' classes (the joining
// class's value adds to the surviving root's); rematerializing subtracts its cost from its class, which is never
// split. Path compression on Find. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace remat {

class EqClasses {
 public:
  // A new singleton class with `value`; returns its node.
  std::int32_t Add(std::int64_t value) {
    nodes_.push_back({-1, value});
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }
  std::int32_t Find(std::int32_t node);
  // `joining`'s class joins `into`'s class; the root of `into` stays the root. No-op when already one class.
  void Merge(std::int32_t joining, std::int32_t into);
  // The value of the class of `node`.
  std::int64_t& Value(std::int32_t node) { return nodes_[Find(node)].value; }
  // The value of a class given its root (a result of Find), without another Find.
  std::int64_t RootValue(std::int32_t root) const { return nodes_[root].value; }
  std::size_t size() const { return nodes_.size(); }

 private:
  struct Node {
    std::int32_t parent;
    std::int64_t value;
  };
  std::vector<Node> nodes_;
};

}  // namespace remat
