// SearchClock: the tick rate's calibration (search_clock.h).
#include "allocator/search_clock.h"

namespace remat {
namespace {

struct TickEpoch {
  std::uint64_t ticks = SearchTicks();
  std::chrono::steady_clock::time_point time = std::chrono::steady_clock::now();
};

const TickEpoch& Epoch() {
  static const TickEpoch epoch;
  return epoch;
}

}  // namespace

void StartSearchClock() { (void)Epoch(); }

std::uint64_t SearchTicksToNs(std::uint64_t ticks) {
#if defined(__x86_64__)
  const TickEpoch& e = Epoch();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - e.time).count();
  const std::uint64_t elapsed = SearchTicks() - e.ticks;
  if (elapsed == 0 || ns <= 0) return 0;
  return static_cast<std::uint64_t>(static_cast<double>(ticks) * (ns / static_cast<double>(elapsed)));
#else
  return ticks;  // steady_clock ticks are nanoseconds on Linux
#endif
}

}  // namespace remat
