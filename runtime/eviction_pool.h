// EvictionPool: the engine's evictable storages (resident, unlocked, not pinned, not deferred), in the order they
// joined. Owned by the engine (engine_impl.h); it knows storages only by their slot index.
//
// Two views of one set:
//   - an intrusive doubly-linked list in insertion order (a lock removes, an unlock appends): the order the
//     policies' Choose walks and the DTR prototype's tie-breaking depends on (PoolOrder, the default path);
//   - dense arrays (struct of arrays, arbitrary slot order: append at the end, swap-remove) carrying each member's
//     insertion sequence number, last access and the policy's staleness weight, so that the dense victim scan
//     (engine_choice.cc) is a tight loop over contiguous doubles; ordering slots by sequence number gives the list
//     order back for ties and the early stop.
// Per-slot links live here, not in the engine's storage records: the pool alone changes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace remat {

class EvictionPool {
 public:
  using Slot = std::uint32_t;
  static constexpr Slot kNone = std::numeric_limits<Slot>::max();

  // Makes room for slots [0, count): called when the engine's storage table grows. Slots start outside the pool.
  void Grow(std::size_t count);

  bool Contains(Slot s) const { return s < pos_.size() && pos_[s] != kNone; }
  std::size_t size() const { return storage_.size(); }
  bool empty() const { return storage_.empty(); }

  // s joins at the end (it must not be a member). `last_access` is its current last access; `negative` says its
  // byte count is negative (the dense scan leaves such pools to the ordered path).
  void Append(Slot s, std::int64_t last_access, bool negative);
  // s leaves (it must be a member).
  void Remove(Slot s);
  // Mirrors a member's new last access into the dense arrays (no-op for a non-member).
  void SetLastAccess(Slot s, std::int64_t clock) {
    if (Contains(s)) last_[pos_[s]] = static_cast<double>(clock);
  }

  // The list, in insertion order: Head(), then Next(s) until kNone. Tail() is the latest member.
  Slot Head() const { return head_; }
  Slot Tail() const { return tail_; }
  Slot Next(Slot s) const { return next_[s]; }

  // The dense arrays (index i in [0, size())): member slot, staleness weight (written by the engine's
  // RefreshWeights), last access as a double (exact below 2^53), insertion sequence number.
  std::span<const Slot> Members() const { return storage_; }
  double* Weights() { return weight_.data(); }
  const double* LastAccesses() const { return last_.data(); }
  const std::uint64_t* Sequence() const { return seq_.data(); }
  // A member's index in the dense arrays.
  std::size_t Position(Slot s) const { return pos_[s]; }
  // Members whose byte count was negative when they joined.
  std::size_t NegativeCount() const { return negative_; }

 private:
  // Per slot (indexed by storage slot).
  std::vector<Slot> prev_, next_;
  std::vector<Slot> pos_;                  // index in the dense arrays, kNone outside the pool
  std::vector<std::uint8_t> negative_of_;  // joined with a negative byte count
  // Dense, per member.
  std::vector<Slot> storage_;
  std::vector<double> weight_;
  std::vector<double> last_;
  std::vector<std::uint64_t> seq_;
  Slot head_ = kNone, tail_ = kNone;
  std::uint64_t next_seq_ = 0;
  std::size_t negative_ = 0;
};

}  // namespace remat
