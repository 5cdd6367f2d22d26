// Virtual memory provider: addresses without memory, for replaying traces in the simulator.
//
// Segments are carved from one process-wide private range with an atomic bump pointer, so two virtual arenas
// never hand out the same address and a segment's base is never 0. Nothing is mapped: BacksMemory() is false and
// nobody may dereference these addresses. Consecutive segments are separated by a guard gap so that adjacency
// across segments is never mistaken for contiguity. Released ranges are not reused (the range is 2^62 bytes).
#include <atomic>
#include <limits>

#include "absl/strings/str_cat.h"
#include "allocator/memory_provider.h"

namespace remat {
namespace {

constexpr std::uintptr_t kRangeBase = std::uintptr_t{1} << 44;  // well above the null page, unlike real heaps
constexpr std::uintptr_t kRangeEnd = std::uintptr_t{1} << 62;
constexpr std::uintptr_t kGuard = std::uintptr_t{1} << 16;

std::atomic<std::uintptr_t> next_address{kRangeBase};

class VirtualProvider final : public MemoryProvider {
 public:
  absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("virtual provider: cannot reserve ", bytes,
                                                     " bytes aligned to ", alignment));
    }
    std::uintptr_t cur = next_address.load(std::memory_order_relaxed);
    for (;;) {
      const std::uintptr_t base = (cur + alignment - 1) & ~(alignment - 1);
      if (base < cur || base >= kRangeEnd || kRangeEnd - base < bytes || kRangeEnd - base - bytes < kGuard) {
        return absl::ResourceExhaustedError(
            absl::StrCat("virtual provider: address range exhausted reserving ", bytes, " bytes"));
      }
      if (next_address.compare_exchange_weak(cur, base + bytes + kGuard, std::memory_order_relaxed)) {
        return Segment{base, bytes};
      }
    }
  }
  void Release(const Segment&) override {}
  bool BacksMemory() const override { return false; }
  std::string_view Name() const override { return "virtual"; }
};

}  // namespace

std::unique_ptr<MemoryProvider> MakeVirtualProvider() { return std::make_unique<VirtualProvider>(); }

}  // namespace remat
