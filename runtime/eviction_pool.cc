#include "runtime/eviction_pool.h"

namespace remat {

void EvictionPool::Grow(std::size_t count) {
  if (count <= pos_.size()) return;
  prev_.resize(count, kNone);
  next_.resize(count, kNone);
  pos_.resize(count, kNone);
  negative_of_.resize(count, 0);
}

void EvictionPool::Append(Slot s, std::int64_t last_access, bool negative) {
  prev_[s] = tail_;
  next_[s] = kNone;
  if (tail_ != kNone) next_[tail_] = s; else head_ = s;
  tail_ = s;
  pos_[s] = static_cast<Slot>(storage_.size());
  storage_.push_back(s);
  weight_.push_back(0);
  last_.push_back(static_cast<double>(last_access));
  seq_.push_back(next_seq_++);
  negative_of_[s] = negative;
  negative_ += negative;
}

void EvictionPool::Remove(Slot s) {
  if (prev_[s] != kNone) next_[prev_[s]] = next_[s]; else head_ = next_[s];
  if (next_[s] != kNone) prev_[next_[s]] = prev_[s]; else tail_ = prev_[s];
  prev_[s] = next_[s] = kNone;
  const Slot pos = pos_[s];
  const Slot last = static_cast<Slot>(storage_.size() - 1);
  if (pos != last) {  // swap-remove: the last member takes s's place
    const Slot moved = storage_[last];
    storage_[pos] = moved;
    weight_[pos] = weight_[last];
    last_[pos] = last_[last];
    seq_[pos] = seq_[last];
    pos_[moved] = pos;
  }
  storage_.pop_back();
  weight_.pop_back();
  last_.pop_back();
  seq_.pop_back();
  pos_[s] = kNone;
  negative_ -= negative_of_[s];
  negative_of_[s] = 0;
}

}  // namespace remat
