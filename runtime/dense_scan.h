// The engine's dense victim scan, pass 1 (runtime/engine_choice.cc, Engine::DenseChoice): approximate scores
// W / staleness over contiguous arrays (Policy::HasStalenessWeight), and their minimum per chunk of slots.
#pragma once

#include <cstddef>
#include <limits>

namespace remat {

// W / (clock - last access), +infinity when the staleness is not positive (the division is then discarded: IEEE
// division by zero only raises a masked flag).
inline double ApproxScore(double weight, double last_access, double clock) {
  const double t = clock - last_access;
  const double x = weight / t;
  return t > 0 ? x : std::numeric_limits<double>::infinity();
}

inline constexpr std::size_t kScanChunk = 64;

// chunk_min[c] = the minimum ApproxScore over slots [c * kScanChunk, min(n, (c + 1) * kScanChunk)); returns the
// minimum over all (+infinity when n == 0). chunk_min must hold ceil(n / kScanChunk) values. Uses AVX2 when the CPU
// has it. Every variant returns exactly the values of the scalar loop over ApproxScore (same IEEE operations).
double ChunkMinima(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min);

// The variants, for tests: two-lane vectors (the baseline build's SSE2), four-lane (AVX2; only where the CPU
// has it), and the scalar loop.
double ChunkMinimaTwoLanes(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min);
double ChunkMinimaFourLanes(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min);
double ChunkMinimaScalar(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min);
bool CpuHasAvx2();

}  // namespace remat
