// SearchClock: the clock the arena times its searches with (ArenaStats::search_ns). Search time is accumulated in
// ticks of a cheap clock (the TSC on x86-64, where reading it costs a fraction of a vDSO clock_gettime) and
// converted to nanoseconds when the statistics are read, from the tick rate observed since the clock's epoch (the
// first call of StartSearchClock, made when the first arena is created).
#pragma once

#include <chrono>
#include <cstdint>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace remat {

inline std::uint64_t SearchTicks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// Starts the calibration interval (idempotent).
void StartSearchClock();
// `ticks` in nanoseconds, at the tick rate observed since StartSearchClock.
std::uint64_t SearchTicksToNs(std::uint64_t ticks);

// Adds the ticks of its lifetime to *sink.
class ScopedSearchTimer {
 public:
  explicit ScopedSearchTimer(std::uint64_t* sink) : sink_(sink), start_(SearchTicks()) {}
  ~ScopedSearchTimer() { *sink_ += SearchTicks() - start_; }
  ScopedSearchTimer(const ScopedSearchTimer&) = delete;
  ScopedSearchTimer& operator=(const ScopedSearchTimer&) = delete;

 private:
  std::uint64_t* sink_;
  std::uint64_t start_;
};

}  // namespace remat
