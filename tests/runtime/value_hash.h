// The tests' value hash: executors that compute each output as a hash of their inputs' values use it, so that a
// replay with a wrong input shows as a different value.
#pragma once

#include <cstdint>

namespace remat {

inline std::uint64_t Mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  return x ^ (x >> 29);
}

}  // namespace remat
