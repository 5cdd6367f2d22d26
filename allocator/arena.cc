// Arena implementation (contract in arena.h). One file of about 900 lines on purpose: every operation below works on
// the same private State under its one lock (placement, coalescing, growth, windows, moves, and when stitching the
// choice of the hole that maps the fewest granules), and splitting it would put that State in a header for no
// reader's benefit. What does not touch the State has files of its own: the search clock (search_clock.h), the
// granule map (granule_map.h), the providers.
//
// Data structures, all guarded by one mutex (the critical sections are a few hundred nanoseconds at most, so a
// plain lock beats anything cleverer at the thread counts PyTorch uses: the caller's thread plus autograd's):
//
//   Node         one node per block, allocated or free, from a pooled free list (no malloc on the hot path once
//                the pool has grown to the working set). `prev`/`next` link the blocks of one segment in address
//                order; a segment's first block has prev == nullptr, its last next == nullptr, so coalescing never
//                crosses a segment boundary.
//   free_index   absl::btree_set of (size, address, Node*): best fit is lower_bound((bytes, 0)); the largest free
//                block is the last element.
//   live         absl::flat_hash_set of allocated Node*, hashed and compared by address (heterogeneous lookup by
//                address): Free/SetOwner/Block are one probe, and a slot is one pointer.
//   segments     sorted by base; each knows its first block (for FindWindow and ForEachBlock).
//
// Invariants (checked by tests/allocator/arena_random_test.cc after every operation):
//   - the blocks of a segment tile it exactly, in address order, each a multiple of the alignment;
//   - no two free blocks are adjacent (Free coalesces with both neighbours);
//   - every free block is in free_index, every allocated block in live, and nothing else;
//   - allocated_bytes + free bytes == reserved_bytes.
//
// Allocate places with lower_bound on the index, splits the chosen block (the new block at its low or high end),
// and re-keys the remainder. Free merges the block into a free lower neighbour and absorbs a free upper one; the
// lower block always survives a merge, so a segment's first block only changes when a kLow placement splits it.
//
// FindWindow is the two-pointer pass of Coop: for each right end r, advance the left end l while the window
// without l still holds the request. With non-negative costs the cheapest window ending at r is exactly [l, r]
// (dropping blocks from the left never raises the cost), and l only moves right, so the pass is O(blocks).
// Each block's cost is read once and parked in its node so the left end can subtract it again. The running sum
// is only a filter (add/subtract drifts by rounding): a window whose running sum comes within a rounding bound of
// the best is re-summed in address order, and windows are compared on those exact sums. So ties are real ties,
// and the result equals a brute-force search bit for bit. While every cost in the run is a multiple of 2^-10
// (integers, halves...; sums below 2^43) the running sum is exact and nothing is re-summed, so the usual
// many-ties case (equal costs) stays O(blocks); many near-ties among other fractions cost O(blocks x window).
#include "allocator/arena.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "allocator/granule_map.h"
#include "allocator/search_clock.h"

namespace remat {
namespace {

struct SegmentRec;

struct Node {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  OwnerId owner = kNoOwner;
  Node* prev = nullptr;  // address order within the segment
  Node* next = nullptr;  // also links the pool's free list
  SegmentRec* segment = nullptr;
  mutable double window_cost = 0;  // FindWindow's scratch: this block's cost in the current search
  bool free = true;
};

struct SegmentRec {
  Segment segment;       // as the provider returned it
  std::size_t usable = 0;  // segment.size rounded down to the alignment: what the blocks tile
  Node* first = nullptr;
};

// The live set holds Node pointers but is keyed by the block's address, which never changes while allocated.
struct AddressHash {
  using is_transparent = void;
  std::size_t operator()(std::uintptr_t a) const { return absl::Hash<std::uintptr_t>{}(a); }
  std::size_t operator()(const Node* n) const { return (*this)(n->address); }
};

struct AddressEq {
  using is_transparent = void;
  static std::uintptr_t Of(std::uintptr_t a) { return a; }
  static std::uintptr_t Of(const Node* n) { return n->address; }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return Of(a) == Of(b);
  }
};

struct FreeKey {
  std::size_t size;
  std::uintptr_t address;
  Node* block;
};

struct FreeKeyLess {
  bool operator()(const FreeKey& a, const FreeKey& b) const {
    return a.size != b.size ? a.size < b.size : a.address < b.address;
  }
};

FreeKey KeyOf(const Node* b) { return FreeKey{b->size, b->address, const_cast<Node*>(b)}; }

struct Unpacked {
  bool has;
  double value;
};
inline Unpacked Unpack(std::optional<double>&& v) { return Unpacked{v.has_value(), v.has_value() ? *v : 0.0}; }

BlockInfo InfoOf(const Node* b) { return BlockInfo{b->address, b->size, b->owner, b->free}; }

// Blocks come from fixed-size chunks and return to an intrusive free list, so steady-state Allocate/Free never
// call malloc for block nodes.
class NodePool {
 public:
  Node* New() {
    if (free_ == nullptr) Grow();
    Node* b = free_;
    free_ = b->next;
    *b = Node{};
    return b;
  }
  void Delete(Node* b) {
    b->next = free_;
    free_ = b;
  }

 private:
  static constexpr std::size_t kChunk = 1024;
  void Grow() {
    chunks_.push_back(std::make_unique<Node[]>(kChunk));
    Node* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) {
      chunk[i].next = (i + 1 < kChunk) ? &chunk[i + 1] : free_;
    }
    free_ = chunk;
  }
  std::vector<std::unique_ptr<Node[]>> chunks_;
  Node* free_ = nullptr;
};

// Reading the clock twice costs about as much as a best-fit lookup (some 20 ns per TSC read under KVM), so
// lookups are timed one in kLookupSample and the sample is scaled; window searches are always timed.
constexpr std::uint64_t kLookupSample = 16;
// Stitching: how many of the best-fitting holes a placement compares by the granules it would newly map.
constexpr int kStitchCandidates = 16;

// The arena whose lock this thread holds while it runs a caller's callback (FindWindow's cost function,
// ForEachBlock's visitor). A call back into that arena from the callback skips the lock instead of deadlocking;
// a call that would change the block list under the running pass fails instead.
thread_local const void* t_in_callback = nullptr;

class CallbackScope {
 public:
  explicit CallbackScope(const void* arena) : saved_(t_in_callback) { t_in_callback = arena; }
  ~CallbackScope() { t_in_callback = saved_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

 private:
  const void* saved_;
};

std::unique_lock<std::mutex> LockUnlessInCallback(std::mutex& mu, const void* arena) {
  if (t_in_callback == arena) return std::unique_lock<std::mutex>();
  return std::unique_lock<std::mutex>(mu);
}

absl::Status InCallbackError(std::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "remat arena: ", std::string(what),
      " called from a FindWindow or ForEachBlock callback of the same arena; only queries are allowed there"));
}

constexpr std::size_t kMinGrowth = std::size_t{2} << 20;  // smallest segment a growing arena reserves

}  // namespace

struct Arena::State {
  std::unique_ptr<MemoryProvider> provider;
  ArenaOptions options;

  // Guards everything below. std::mutex, not absl::Mutex: Debian's abseil is built with deadlock detection,
  // which costs a graph lookup on every lock.
  mutable std::mutex mu;
  PressureHandler* handler = nullptr;
  int handler_calls = 0;  // calls into `handler` in flight (made without `mu` held)
  std::condition_variable handler_idle;
  std::vector<std::unique_ptr<SegmentRec>> segments;  // sorted by base
  absl::btree_set<FreeKey, FreeKeyLess> free_index;
  absl::flat_hash_set<Node*, AddressHash, AddressEq> live;
  NodePool pool;

  std::size_t allocated = 0;
  std::size_t reserved = 0;
  std::size_t peak = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t moves = 0;
  std::uint64_t pressure_allocations = 0;
  mutable std::uint64_t search_ticks = 0;
  std::uint64_t lookups = 0;  // best-fit lookups, of which one in kLookupSample is timed
  absl::Status grow_error;  // why the last attempt to grow failed, for the exhaustion message
  // Stitching (ArenaOptions::granule): the mapped granules; whether the last Place failed for lack of physical
  // memory (then growing the address space does not help); the last failed provider Map.
  std::optional<GranuleMap> granules;
  bool physically_full = false;
  absl::Status map_error;
  std::vector<GranuleRange> granule_ranges;  // scratch

  // With `mu` held.
  void EndHandlerCall() {
    if (--handler_calls == 0) handler_idle.notify_all();
  }

  ~State() {
    for (auto& s : segments) provider->Release(s->segment);
  }

  // Rounds up to the alignment; 0 becomes one unit. Fails on overflow.
  absl::StatusOr<std::size_t> Align(std::size_t bytes) const {
    const std::size_t a = options.alignment;
    if (bytes == 0) return a;
    if (bytes > std::numeric_limits<std::size_t>::max() - (a - 1)) {
      return absl::ResourceExhaustedError(absl::StrCat("remat arena: request of ", bytes, " bytes is too large"));
    }
    return (bytes + a - 1) & ~(a - 1);
  }

  // Adds a segment of at least `bytes` (aligned) as one free block.
  absl::Status AddSegment(std::size_t bytes) {
    absl::StatusOr<Segment> seg = provider->Reserve(bytes, options.alignment);
    if (!seg.ok()) return seg.status();
    // Only what was asked for: a provider that rounds up (to pages) must not raise a hard budget.
    const std::size_t usable = std::min(seg->size, bytes) & ~(options.alignment - 1);
    if (seg->base % options.alignment != 0 || usable < bytes) {
      provider->Release(*seg);
      return absl::InternalError(absl::StrCat("remat arena: provider ", std::string(provider->Name()),
                                              " returned a segment at ", seg->base, " of ", seg->size,
                                              " bytes for a request of ", bytes, " bytes aligned to ",
                                              options.alignment));
    }
    auto rec = std::make_unique<SegmentRec>();
    rec->segment = *seg;
    rec->usable = usable;
    Node* b = pool.New();
    b->address = seg->base;
    b->size = usable;
    b->segment = rec.get();
    b->free = true;
    rec->first = b;
    free_index.insert(KeyOf(b));
    reserved += usable;
    auto pos = std::lower_bound(segments.begin(), segments.end(), seg->base,
                                [](const std::unique_ptr<SegmentRec>& s, std::uintptr_t base) {
                                  return s->segment.base < base;
                                });
    segments.insert(pos, std::move(rec));
    return absl::OkStatus();
  }

  // Re-keys the free block at `it` to its node's current size and address. In place when the new key still sorts
  // between its neighbours (the usual case: the remainder of a split or a merged block keeps its place), which also
  // keeps the tree from going empty and back (a lone free block: two node allocations per Allocate and per Free).
  void Rekey(decltype(free_index)::iterator it) {
    const FreeKey key = KeyOf(it->block);
    const FreeKeyLess less;
    const bool after_prev = it == free_index.begin() || less(*std::prev(it), key);
    const bool before_next = std::next(it) == free_index.end() || less(key, *std::next(it));
    if (after_prev && before_next) {
      // Only size and address change, and the order they define is kept: the set stays sorted.
      const_cast<FreeKey&>(*it) = key;
      return;
    }
    free_index.erase(it);  // before the insert: a btree's insert invalidates its iterators
    free_index.insert(key);
  }

  // Best fit and split; nullptr when no free block holds `aligned`.
  Node* Place(std::size_t aligned, OwnerId owner, Placement placement) {
    decltype(free_index)::iterator it;
    if ((++lookups & (kLookupSample - 1)) == 0) {
      const std::uint64_t start = SearchTicks();
      it = free_index.lower_bound(FreeKey{aligned, 0, nullptr});
      search_ticks += (SearchTicks() - start) * kLookupSample;
    } else {
      it = free_index.lower_bound(FreeKey{aligned, 0, nullptr});
    }
    if (it == free_index.end()) return nullptr;
    if (placement == Placement::kTop) {
      for (auto candidate = it; candidate != free_index.end(); ++candidate) {
        if (candidate->block->address > it->block->address) it = candidate;
      }
    }
    physically_full = false;
    if (granules && !ChooseStitchedHole(aligned, &it, &placement)) {
      physically_full = true;
      return nullptr;
    }
    Node* f = it->block;
    Node* b;
    if (f->size == aligned) {
      free_index.erase(it);
      b = f;
    } else {
      b = pool.New();
      b->segment = f->segment;
      b->size = aligned;
      f->size -= aligned;
      if (placement == Placement::kLow) {
        b->address = f->address;
        f->address += aligned;
        b->prev = f->prev;
        b->next = f;
        if (f->prev != nullptr) {
          f->prev->next = b;
        } else {
          f->segment->first = b;
        }
        f->prev = b;
      } else {
        b->address = f->address + f->size;
        b->next = f->next;
        b->prev = f;
        if (f->next != nullptr) f->next->prev = b;
        f->next = b;
      }
      Rekey(it);  // f is smaller now, and kLow moved its address
    }
    b->free = false;
    b->owner = owner;
    live.insert(b);
    allocated += aligned;
    peak = std::max(peak, allocated);
    ++allocations;
    if (granules && !MapGranules(b)) return nullptr;
    return b;
  }

  // Stitching: among the best-fitting holes (the first kStitchCandidates in size order from `*it`), the hole and end
  // that map the fewest new granules, the better fit on a tie: a small block goes into granules already mapped
  // rather than into a fresh one, and a request fails only when no candidate fits the physical limit. Sets `*it` and
  // `*placement` (kLow or kHigh) to the choice; false when even the best does not fit.
  bool ChooseStitchedHole(std::size_t aligned, decltype(free_index)::iterator* it, Placement* placement) const {
    const std::size_t spanned = granules->MinGranules(aligned);
    const std::size_t least = spanned > 2 ? spanned - 2 : 0;  // at best both edge granules are shared
    const bool low_first = *placement == Placement::kLow;
    std::size_t best_new = std::numeric_limits<std::size_t>::max();
    auto best = *it;
    Placement best_end = *placement;
    int seen = 0;
    for (auto candidate = *it; candidate != free_index.end() && seen < kStitchCandidates; ++candidate, ++seen) {
      const Node* hole = candidate->block;
      for (const bool low : {low_first, !low_first}) {
        const std::uintptr_t at = low ? hole->address : hole->address + hole->size - aligned;
        const std::size_t added = granules->NewGranules(at, aligned);
        if (added < best_new) {
          best_new = added;
          best = candidate;
          best_end = low ? Placement::kLow : Placement::kHigh;
        }
        if (hole->size == aligned) break;  // both ends are the same place
      }
      if (best_new == least) break;
    }
    const Node* hole = best->block;
    const std::uintptr_t at = best_end == Placement::kLow ? hole->address : hole->address + hole->size - aligned;
    if (!granules->Fits(at, aligned)) return false;
    *it = best;
    *placement = best_end;
    return true;
  }

  // Stitching: backs b's newly used granules with memory. On a provider error, b is freed again (its granules
  // unmapped) and the error kept for the exhaustion message.
  bool MapGranules(Node* b) {
    granule_ranges.clear();
    granules->Add(b->address, b->size, &granule_ranges);
    for (std::size_t i = 0; i < granule_ranges.size(); ++i) {
      map_error = provider->Map(granule_ranges[i].address, granule_ranges[i].bytes);
      if (map_error.ok()) continue;
      for (std::size_t k = 0; k < i; ++k) provider->Unmap(granule_ranges[k].address, granule_ranges[k].bytes);
      granule_ranges.clear();
      granules->Remove(b->address, b->size, &granule_ranges);  // the mapped count only: nothing else to unmap
      --allocations;
      live.erase(b);
      Release(b, /*unmap=*/false);
      physically_full = true;
      return false;
    }
    return true;
  }

  // Frees allocated block b, already out of `live`: coalesces it with free neighbours and, when stitching and
  // `unmap`, gives back the granules nothing else overlaps.
  void Release(Node* b, bool unmap = true) {
    // Both neighbours are needed below and each is likely a cache miss: start both loads now so they overlap.
    __builtin_prefetch(b->prev);
    __builtin_prefetch(b->next);
    if (granules && unmap) {
      granule_ranges.clear();
      granules->Remove(b->address, b->size, &granule_ranges);
      for (const GranuleRange& r : granule_ranges) provider->Unmap(r.address, r.bytes);
    }
    allocated -= b->size;
    b->free = true;
    b->owner = kNoOwner;
    // The block that survives a merge keeps its entry in the index, re-keyed (Rekey); a block with no free
    // neighbour gets one.
    Node* lower = b->prev;
    std::optional<decltype(free_index)::iterator> kept;
    FreeKey lower_key{};  // lower's key in the index while its node grows
    if (lower != nullptr && lower->free) {
      lower_key = KeyOf(lower);
      kept = free_index.find(lower_key);
      lower->size += b->size;
      lower->next = b->next;
      if (b->next != nullptr) b->next->prev = lower;
      pool.Delete(b);
      b = lower;
    }
    Node* upper = b->next;
    if (upper != nullptr && upper->free) {
      auto upper_it = free_index.find(KeyOf(upper));
      b->size += upper->size;
      b->next = upper->next;
      if (upper->next != nullptr) upper->next->prev = b;
      pool.Delete(upper);
      if (!kept) {  // b takes upper's entry (Rekey reads the node it names)
        const_cast<FreeKey&>(*upper_it).block = b;
        kept = upper_it;
      } else {  // both neighbours were free: lower's entry stays (erasing invalidates iterators: find it again)
        free_index.erase(upper_it);
        kept = free_index.find(lower_key);
      }
    }
    if (kept) {
      Rekey(*kept);
    } else {
      free_index.insert(KeyOf(b));
    }
  }

  // Place, growing first when the options allow it.
  Node* PlaceOrGrow(std::size_t aligned, OwnerId owner, Placement placement) {
    if (Node* b = Place(aligned, owner, placement)) return b;
    if (!options.grow || physically_full) return nullptr;  // more address space gives no memory
    grow_error = absl::ResourceExhaustedError(absl::StrCat("the growth limit of ", options.growth_limit,
                                                           " bytes is reached"));
    std::size_t want = std::max({aligned, options.capacity, kMinGrowth});
    want = (want + options.alignment - 1) & ~(options.alignment - 1);
    if (options.growth_limit != 0) {
      if (reserved >= options.growth_limit || options.growth_limit - reserved < aligned) return nullptr;
      want = std::max(aligned, std::min(want, (options.growth_limit - reserved) & ~(options.alignment - 1)));
    }
    grow_error = AddSegment(want);
    if (!grow_error.ok()) return nullptr;
    return Place(aligned, owner, placement);
  }

  std::size_t LargestSegment() const {
    std::size_t largest = 0;
    for (const auto& seg : segments) largest = std::max(largest, seg->usable);
    return largest;
  }

  std::size_t LargestFree() const {
    return free_index.empty() ? 0 : std::prev(free_index.end())->size;
  }

  absl::Status Exhausted(std::size_t bytes, std::size_t aligned, std::string_view why) const {
    std::string message;
    if (granules) {
      message = absl::StrCat("remat arena: cannot place ", bytes, " bytes (", aligned, " aligned): ",
                             granules->mapped_bytes(), " of ", granules->limit(), " physical bytes mapped in ",
                             granules->granule(), "-byte granules (", allocated, " bytes allocated); ",
                             std::string(why));
      if (!map_error.ok()) absl::StrAppend(&message, "; mapping failed: ", std::string(map_error.message()));
      return absl::ResourceExhaustedError(message);
    }
    message = absl::StrCat(
        "remat arena: cannot place ", bytes, " bytes (", aligned, " aligned): ", reserved - allocated,
        " bytes free in ", free_index.size(), " free blocks, largest free block ", LargestFree(), " bytes; ",
        allocated, " of ", reserved, " reserved bytes allocated; ", std::string(why));
    if (options.grow && !grow_error.ok()) {
      absl::StrAppend(&message, "; cannot grow: ", std::string(grow_error.message()));
    }
    return absl::ResourceExhaustedError(message);
  }

  Node* FindLive(std::uintptr_t address) const {
    auto it = live.find(address);
    return it == live.end() ? nullptr : *it;
  }

  const SegmentRec* SegmentOf(std::uintptr_t address) const {
    auto pos = std::upper_bound(segments.begin(), segments.end(), address,
                                [](std::uintptr_t a, const std::unique_ptr<SegmentRec>& s) {
                                  return a < s->segment.base;
                                });
    if (pos == segments.begin()) return nullptr;
    const SegmentRec* s = std::prev(pos)->get();
    return address < s->segment.base + s->usable ? s : nullptr;
  }
};

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(std::unique_ptr<MemoryProvider> provider,
                                                     ArenaOptions options) {
  if (provider == nullptr) return absl::InvalidArgumentError("remat arena: no memory provider");
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remat arena: alignment must be a power of two, got ", options.alignment));
  }
  StartSearchClock();  // its calibration interval starts with the first arena
  if (options.granule != 0) {
    if ((options.granule & (options.granule - 1)) != 0 || options.granule % options.alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat("remat arena: the granule must be a power of two and a multiple "
                                                     "of the alignment (", options.alignment, "), got ",
                                                     options.granule));
    }
    if (options.physical_limit < options.granule) {
      return absl::InvalidArgumentError(absl::StrCat("remat arena: a stitching arena's physical limit (",
                                                     options.physical_limit, " bytes) must hold one granule (",
                                                     options.granule, " bytes)"));
    }
  }
  auto state = std::make_unique<State>();
  state->provider = std::move(provider);
  state->options = options;
  if (options.granule != 0) state->granules.emplace(options.granule, options.physical_limit);
  if (options.capacity > 0) {
    std::lock_guard<std::mutex> lock(state->mu);
    absl::StatusOr<std::size_t> aligned = state->Align(options.capacity);
    if (!aligned.ok()) return aligned.status();
    absl::Status s = state->AddSegment(*aligned);
    if (!s.ok()) return s;
  }
  return std::unique_ptr<Arena>(new Arena(std::move(state)));
}

Arena::Arena(std::unique_ptr<State> state) : state_(std::move(state)) {}
Arena::~Arena() = default;

absl::StatusOr<std::uintptr_t> Arena::TryAllocate(std::size_t bytes, OwnerId owner, Placement placement) {
  State& s = *state_;
  if (t_in_callback == &s) return InCallbackError("TryAllocate");
  absl::StatusOr<std::size_t> aligned = s.Align(bytes);
  if (!aligned.ok()) return aligned.status();
  std::lock_guard<std::mutex> lock(s.mu);
  if (Node* b = s.PlaceOrGrow(*aligned, owner, placement)) return b->address;
  return s.Exhausted(bytes, *aligned, "no free block is large enough");
}

absl::StatusOr<std::uintptr_t> Arena::Allocate(std::size_t bytes, OwnerId owner, Placement placement) {
  State& s = *state_;
  if (t_in_callback == &s) return InCallbackError("Allocate");
  absl::StatusOr<std::size_t> aligned = s.Align(bytes);
  if (!aligned.ok()) return aligned.status();
  if (s.granules && s.granules->MinGranules(*aligned) * s.granules->granule() > s.granules->limit()) {
    std::lock_guard<std::mutex> lock(s.mu);  // evicting everything would not help: do not ask the handler
    return s.Exhausted(bytes, *aligned, "the request is larger than the physical limit");
  }
  bool counted = false;
  int rounds = 0;
  for (;;) {
    PressureHandler* handler;
    std::uint64_t frees_before, moves_before;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (Node* b = s.PlaceOrGrow(*aligned, owner, placement)) return b->address;
      handler = s.handler;
      if (handler == nullptr) return s.Exhausted(bytes, *aligned, "no pressure handler is set");
      if (!s.options.grow && *aligned > s.LargestSegment()) {
        // Evicting everything would not help: do not ask the handler to try.
        return s.Exhausted(bytes, *aligned, "the request is larger than any segment of the arena");
      }

      if (!counted) {
        ++s.pressure_allocations;
        counted = true;
      }
      frees_before = s.frees;
      moves_before = s.moves;
      ++s.handler_calls;
    }
    // Without the lock: the handler evicts through Free.
    const absl::StatusOr<bool> progress = handler->MakeRoom(*this, *aligned);
    ++rounds;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.EndHandlerCall();
      if (!progress.ok()) {
        return absl::Status(progress.status().code(),
                            absl::StrCat("remat arena: making room for ", bytes, " bytes failed: ",
                                         progress.status().message()));
      }
      if (*progress && (s.frees != frees_before || s.moves != moves_before)) continue;
      if (Node* b = s.PlaceOrGrow(*aligned, owner, placement)) return b->address;  // freed by another thread
      handler = s.handler;
      if (handler != nullptr) ++s.handler_calls;
    }
    // Giving up. The handler says what holds the memory without our lock held: it may read the blocks.
    const std::string held = handler != nullptr ? handler->DescribeMemory() : std::string();
    std::lock_guard<std::mutex> lock(s.mu);
    if (handler != nullptr) s.EndHandlerCall();
    if (Node* b = s.PlaceOrGrow(*aligned, owner, placement)) return b->address;
    return s.Exhausted(bytes, *aligned,
                       absl::StrCat("the pressure handler freed nothing after ", rounds, " round(s)",
                                    held.empty() ? "" : "; ", held));
  }
}

absl::Status Arena::Free(std::uintptr_t address) {
  State& s = *state_;
  if (t_in_callback == &s) return InCallbackError("Free");
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(address);
  if (it == s.live.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("remat arena: Free(", address, "): not the start of an allocated block"));
  }
  Node* b = *it;
  s.live.erase(it);
  ++s.frees;
  s.Release(b);
  return absl::OkStatus();
}

absl::Status Arena::SetOwner(std::uintptr_t address, OwnerId owner) {
  State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  Node* b = s.FindLive(address);
  if (b == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("remat arena: SetOwner(", address, "): not the start of an allocated block"));
  }
  b->owner = owner;
  return absl::OkStatus();
}

absl::Status Arena::Move(std::uintptr_t from, std::uintptr_t to) {
  State& s = *state_;
  if (t_in_callback == &s) return InCallbackError("Move");
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.granules) {
    return absl::FailedPreconditionError("remat arena: a stitching arena does not move blocks (issue 18)");
  }
  Node* b = s.FindLive(from);
  if (b == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("remat arena: Move(", from, ", ", to, "): not the start of an allocated block"));
  }
  Node* lower = b->prev != nullptr && b->prev->free ? b->prev : nullptr;
  Node* upper = b->next != nullptr && b->next->free ? b->next : nullptr;
  const std::uintptr_t lo = lower != nullptr ? lower->address : b->address;
  const std::uintptr_t hi = upper != nullptr ? upper->address + upper->size : b->address + b->size;
  if (to % s.options.alignment != 0 || to < lo || to > hi - b->size) {
    return absl::InvalidArgumentError(absl::StrCat("remat arena: Move(", from, ", ", to, "): the ", b->size,
                                                   "-byte block can only move within [", lo, ", ", hi,
                                                   ") at multiples of ", s.options.alignment));
  }
  if (to == from) return absl::OkStatus();
  // Relink [lo, hi) as: a free block [lo, to) if not empty, the block at `to`, a free block [to + size, hi) if not
  // empty. The neighbours outside are allocated (free blocks are never adjacent), so nothing else coalesces.
  Node* before = lower != nullptr ? lower->prev : b->prev;
  Node* after = upper != nullptr ? upper->next : b->next;
  Node* spare[2] = {lower, upper};
  int spares = 0;
  for (Node* n : spare) {
    if (n != nullptr) {
      s.free_index.erase(KeyOf(n));
      spare[spares++] = n;
    }
  }
  auto free_node = [&](std::uintptr_t address, std::size_t size) {
    Node* n = spares > 0 ? spare[--spares] : s.pool.New();
    *n = Node{};
    n->address = address;
    n->size = size;
    n->segment = b->segment;
    return n;
  };
  s.live.erase(b);
  b->address = to;
  Node* chain[3];
  int k = 0;
  if (to > lo) chain[k++] = free_node(lo, to - lo);
  chain[k++] = b;
  if (to + b->size < hi) chain[k++] = free_node(to + b->size, hi - (to + b->size));
  while (spares > 0) s.pool.Delete(spare[--spares]);
  Node* prev = before;
  for (int i = 0; i < k; ++i) {
    chain[i]->prev = prev;
    if (prev != nullptr) {
      prev->next = chain[i];
    } else {
      b->segment->first = chain[i];
    }
    prev = chain[i];
    if (chain[i]->free) s.free_index.insert(KeyOf(chain[i]));
  }
  prev->next = after;
  if (after != nullptr) after->prev = prev;
  s.live.insert(b);
  ++s.moves;
  return absl::OkStatus();
}

absl::StatusOr<BlockInfo> Arena::Block(std::uintptr_t address) const {
  const State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  if (const auto* b = s.FindLive(address)) return InfoOf(b);
  // A free block: walk its segment (free blocks are not indexed by address).
  if (const SegmentRec* seg = s.SegmentOf(address)) {
    for (const auto* b = seg->first; b != nullptr && b->address <= address; b = b->next) {
      if (b->address == address) return InfoOf(b);
    }
  }
  return absl::NotFoundError(absl::StrCat("remat arena: no block starts at ", address));
}

std::optional<Window> Arena::FindWindow(std::size_t bytes, BlockCost cost) const {
  const State& s = *state_;
  absl::StatusOr<std::size_t> aligned_or = s.Align(bytes);
  if (!aligned_or.ok()) return std::nullopt;
  const std::size_t aligned = *aligned_or;
  if (t_in_callback == &s) return std::nullopt;  // a nested pass would overwrite this one's costs
  std::lock_guard<std::mutex> lock(s.mu);
  ScopedSearchTimer timer(&s.search_ticks);
  CallbackScope scope(&s);

  const Node* best_l = nullptr;
  const Node* best_r = nullptr;
  double best_cost = 0;  // summed in address order, exactly as a caller would sum the window
  // Multiples of 2^-10 whose sums stay below 2^43 add and subtract exactly (they are integers below 2^53 once
  // scaled by 2^10, an exact scaling). Integer costs and halves, quarters... take the exact path.
  constexpr double kScale = 1024;
  constexpr double kExactBelow = 8796093022208.0;  // 2^43
  for (const auto& seg : s.segments) {
    if (seg->usable < aligned) continue;
    const Node* l = seg->first;
    std::size_t sum_size = 0;
    double sum_cost = 0;    // running sum: a filter, off by rounding unless `integral`
    double max_sum = 0;     // largest running sum since the last reset, which bounds that rounding
    bool integral = true;   // every cost since the last reset is a multiple of 2^-10: the running sum is exact
    std::size_t owned = 0;  // allocated blocks in [l, r]
    for (const Node* r = seg->first; r != nullptr; r = r->next) {
      double c = 0;
      if (!r->free) {
        // Unpacked at once: copying the optional around costs a failed store-forward per call with GCC 12.
        const auto [has, value] = Unpack(cost(InfoOf(r)));
        c = value;
        if (!has || !(c <= std::numeric_limits<double>::max())) {  // nullopt, NaN or +inf: a barrier
          l = r->next;
          sum_size = 0;
          sum_cost = 0;
          max_sum = 0;
          integral = true;
          owned = 0;
          continue;
        }
        c = std::max(c, 0.0);
        integral = integral && c < kExactBelow &&
                   c * kScale == static_cast<double>(static_cast<std::int64_t>(c * kScale));
        ++owned;
      }
      r->window_cost = c;
      sum_size += r->size;
      sum_cost += c;
      max_sum = std::max(max_sum, sum_cost);
      if (sum_size - l->size >= aligned) {
        do {
          sum_size -= l->size;
          sum_cost -= l->window_cost;
          owned -= l->free ? 0 : 1;
          l = l->next;
        } while (sum_size - l->size >= aligned);
        if (owned == 0) {  // only free blocks left: the sum is exactly 0, whatever rounding happened before
          sum_cost = 0;
          max_sum = 0;
          integral = true;
        }
      }
      if (sum_size < aligned) continue;
      double exact = sum_cost;
      if (!integral || max_sum >= kExactBelow) {
        // Each add or subtract rounds by at most max_sum * 2^-53; 1e-8 covers a run of some 10^8 of them.
        if (best_r != nullptr && !(sum_cost < best_cost + 1e-8 * max_sum)) continue;
        // A candidate: compare its exact sum. (Many windows within rounding of each other make this
        // O(blocks x window); costs on the exact path never get here.)
        exact = 0;
        for (const Node* b = l;; b = b->next) {
          exact += b->window_cost;
          if (b == r) break;
        }
      }
      if (best_r == nullptr || exact < best_cost) {
        best_l = l;
        best_r = r;
        best_cost = exact;
        if (best_cost <= 0) break;  // nothing is cheaper, and every later window ends higher
      }
    }
    if (best_r != nullptr && best_cost <= 0) break;
  }
  if (best_r == nullptr) return std::nullopt;
  Window w;
  w.address = best_l->address;
  for (const Node* b = best_l;; b = b->next) {
    w.size += b->size;
    w.cost += b->window_cost;
    if (!b->free) w.owners.push_back(b->owner);
    if (b == best_r) break;
  }
  return w;
}

std::size_t Arena::AdjacentFreeBytes(std::uintptr_t address) const {
  const State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  const Node* b = s.FindLive(address);
  if (b == nullptr) return 0;
  std::size_t bytes = 0;
  if (b->prev != nullptr && b->prev->free) bytes += b->prev->size;
  if (b->next != nullptr && b->next->free) bytes += b->next->size;
  return bytes;
}

void Arena::SetPressureHandler(PressureHandler* handler) {
  State& s = *state_;
  if (t_in_callback == &s) {
    s.handler = handler;
    return;
  }
  std::unique_lock<std::mutex> lock(s.mu);
  s.handler = handler;
  s.handler_idle.wait(lock, [&] { return s.handler_calls == 0; });
}

ArenaStats Arena::Stats() const {
  const State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  ArenaStats st;
  st.allocated_bytes = s.allocated;
  st.reserved_bytes = s.reserved;
  st.peak_allocated_bytes = s.peak;
  st.free_blocks = s.free_index.size();
  st.free_bytes = s.reserved - s.allocated;
  st.largest_free_block = s.LargestFree();
  st.allocations = s.allocations;
  st.frees = s.frees;
  st.moves = s.moves;
  st.pressure_allocations = s.pressure_allocations;
  st.search_ns = SearchTicksToNs(s.search_ticks);
  if (s.granules) {
    st.physical_bytes = s.granules->mapped_bytes();
    st.peak_physical_bytes = s.granules->peak_bytes();
    st.physical_limit = s.granules->limit();
    st.granule = s.granules->granule();
  }
  return st;
}

std::size_t Arena::PeakAllocatedBytes() const {
  const State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  return s.peak;
}

std::size_t Arena::PeakBudgetedBytes() const {
  const State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  return s.granules ? s.granules->peak_bytes() : s.peak;
}

bool Arena::stitched() const { return state_->granules.has_value(); }

void Arena::ResetPeak() {
  const auto lock = LockUnlessInCallback(state_->mu, state_.get());
  state_->peak = state_->allocated;
  if (state_->granules) state_->granules->ResetPeak();
}

void Arena::ForEachBlock(const std::function<void(const BlockInfo&)>& visit) const {
  const State& s = *state_;
  const auto lock = LockUnlessInCallback(s.mu, &s);
  CallbackScope scope(&s);
  for (const auto& seg : s.segments) {
    for (const Node* b = seg->first; b != nullptr; b = b->next) visit(InfoOf(b));
  }
}

std::size_t Arena::alignment() const { return state_->options.alignment; }

const MemoryProvider& Arena::provider() const { return *state_->provider; }

}  // namespace remat
