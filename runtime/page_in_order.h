// PageInOrder: which paged storages to bring back next (issue 19, "page-ins prefetched ahead of use, in the previous
// iteration's order where known"). The pager (pager.h) feeds it and asks it; it decides nothing.
//
// Storage ids do not survive an iteration of a training loop for what the step computes (each step makes new
// activations), so those are known here by a key that does: the name of the op that produced them and their size.
// Constants (weights, optimizer state) keep their storage: their key is the storage itself. The
// order is learned as a successor map: when a storage that had been paged is read, its key becomes the successor of
// the key read before it. Next(n) follows that chain from the last key read: what the previous pass read after it.
// Where nothing is known (the first pass, a new key) it answers nothing, and the caller falls back to the storages
// paged out last (a backward pass reads activations in the reverse of the order the forward pass made them).
// Candidates: the storages paged now, per key and overall, in page-out order; Take pops the most recent one of a key
// still paged (entries that are no longer paged are skipped lazily, so the lists never need a search).
// Bounded: one successor per key; the candidate lists hold each page-out once, and are compacted when they hold more
// than twice the storages paged now (NotePagedBack counts those that came back or were dropped).
// Not thread-safe (the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"

namespace remat {

class PageInOrder {
 public:
  struct Key {
    std::uint32_t name = 0;  // interned producer op name + 1; 0 for a constant
    std::int64_t size = 0;
    std::uint32_t constant = 0;  // a constant's storage + 1 (weights keep their storage across iterations), else 0
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.name, k.size, k.constant);
    }
  };

  // Storage `s` was paged out. `paged(s, key)` says whether a listed storage is still paged as that key (to compact).
  void NotePagedOut(std::uint32_t s, Key key, absl::FunctionRef<bool(std::uint32_t, Key)> paged) {
    ++paged_now_;
    if (recent_.size() > 2 * paged_now_ + 64) Compact(paged);
    by_key_[key].push_back(s);
    recent_.push_back(s);
    recent_keys_.push_back(key);
  }
  // A paged storage came back or lost its host copy.
  void NotePagedBack() {
    if (paged_now_ > 0) --paged_now_;
  }
  // A storage of `key` that had been paged is read now (after its page-in).
  void NoteRead(Key key) {
    if (has_last_) successor_[last_] = key;
    last_ = key;
    has_last_ = true;
  }
  // Up to `n` keys expected next, following the successor chain from the last read (may repeat a key).
  std::vector<Key> Next(int n) const {
    std::vector<Key> out;
    if (!has_last_) return out;
    Key at = last_;
    for (int i = 0; i < n; ++i) {
      auto it = successor_.find(at);
      if (it == successor_.end()) break;
      at = it->second;
      out.push_back(at);
    }
    return out;
  }
  // The storage of `key` paged out last that `paged(s, key)` still confirms, or -1 (and forgets it when found).
  std::int64_t Take(Key key, absl::FunctionRef<bool(std::uint32_t, Key)> paged) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return -1;
    std::vector<std::uint32_t>& list = it->second;
    while (!list.empty()) {
      const std::uint32_t s = list.back();
      list.pop_back();
      if (paged(s, key)) return s;
    }
    by_key_.erase(it);
    return -1;
  }
  // The storage paged out last that `paged(s)` still confirms, or -1 (forgotten when found).
  std::int64_t TakeMostRecent(absl::FunctionRef<bool(std::uint32_t, Key)> paged) {
    while (!recent_.empty()) {
      const std::uint32_t s = recent_.back();
      const Key key = recent_keys_.back();
      recent_.pop_back();
      recent_keys_.pop_back();
      if (paged(s, key)) return s;
    }
    return -1;
  }
  bool learned() const { return !successor_.empty(); }
  std::size_t listed() const { return recent_.size(); }  // candidate entries held (bounded, see above)

 private:
  void Compact(absl::FunctionRef<bool(std::uint32_t, Key)> paged) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < recent_.size(); ++i) {
      if (!paged(recent_[i], recent_keys_[i])) continue;
      recent_[kept] = recent_[i];
      recent_keys_[kept] = recent_keys_[i];
      ++kept;
    }
    recent_.resize(kept);
    recent_keys_.resize(kept);
    for (auto it = by_key_.begin(); it != by_key_.end();) {
      std::erase_if(it->second, [&](std::uint32_t s) { return !paged(s, it->first); });
      if (it->second.empty()) {
        by_key_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  absl::flat_hash_map<Key, std::vector<std::uint32_t>> by_key_;
  std::vector<std::uint32_t> recent_;
  std::vector<Key> recent_keys_;  // parallel to recent_
  std::size_t paged_now_ = 0;
  absl::flat_hash_map<Key, Key> successor_;
  Key last_;
  bool has_last_ = false;
};

}  // namespace remat
