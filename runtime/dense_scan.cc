#include "runtime/dense_scan.h"

#include <algorithm>
#include <cstring>

namespace remat {
namespace {

// The same operations as ApproxScore, kLanes at a time (GCC vector extensions: the compiler does not vectorize a
// floating-point min reduction by itself).
template <int kLanes>
struct DoubleLanes;
template <>
struct DoubleLanes<2> {
  typedef double Type __attribute__((vector_size(16)));
};
template <>
struct DoubleLanes<4> {
  typedef double Type __attribute__((vector_size(32)));
};

template <int kLanes>
[[gnu::always_inline]] inline double ChunkMinimaImpl(const double* __restrict weight, const double* __restrict last,
                                                     std::size_t n, double clock, double* __restrict chunk_min) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  using V = typename DoubleLanes<kLanes>::Type;
  const V zero = {};
  const V clock_v = zero + clock;
  const V inf_v = zero + kInf;
  double total = kInf;
  for (std::size_t base = 0; base < n; base += kScanChunk) {
    const std::size_t end = std::min(n, base + kScanChunk);
    std::size_t i = base;
    V m_v = inf_v;
    for (; i + kLanes <= end; i += kLanes) {
      V w_v, l_v;
      std::memcpy(&w_v, weight + i, sizeof(V));
      std::memcpy(&l_v, last + i, sizeof(V));
      const V t_v = clock_v - l_v;
      const V x_v = w_v / t_v;
      const V q_v = t_v > zero ? x_v : inf_v;
      m_v = q_v < m_v ? q_v : m_v;
    }
    double m = kInf;
    for (int k = 0; k < kLanes; ++k) m = m_v[k] < m ? m_v[k] : m;
    for (; i < end; ++i) {
      const double q = ApproxScore(weight[i], last[i], clock);
      m = q < m ? q : m;
    }
    chunk_min[base / kScanChunk] = m;
    total = m < total ? m : total;
  }
  return total;
}

}  // namespace

double ChunkMinimaScalar(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min) {
  double total = std::numeric_limits<double>::infinity();
  for (std::size_t base = 0; base < n; base += kScanChunk) {
    double m = std::numeric_limits<double>::infinity();
    for (std::size_t i = base, end = std::min(n, base + kScanChunk); i < end; ++i) {
      const double q = ApproxScore(weight[i], last[i], clock);
      m = q < m ? q : m;
    }
    chunk_min[base / kScanChunk] = m;
    total = m < total ? m : total;
  }
  return total;
}

double ChunkMinimaTwoLanes(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min) {
  return ChunkMinimaImpl<2>(weight, last, n, clock, chunk_min);
}

#if defined(__x86_64__) && defined(__GNUC__)
// 10k slots: 3.3 us with four AVX2 lanes, 6.6 us with two SSE2 lanes (four-lane vectors lowered to SSE2: 34 us).
[[gnu::target("avx2")]] double ChunkMinimaFourLanes(const double* weight, const double* last, std::size_t n,
                                                    double clock, double* chunk_min) {
  return ChunkMinimaImpl<4>(weight, last, n, clock, chunk_min);
}
bool CpuHasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
#else
double ChunkMinimaFourLanes(const double* weight, const double* last, std::size_t n, double clock,
                            double* chunk_min) {
  return ChunkMinimaImpl<4>(weight, last, n, clock, chunk_min);
}
bool CpuHasAvx2() { return false; }
#endif

double ChunkMinima(const double* weight, const double* last, std::size_t n, double clock, double* chunk_min) {
  if (CpuHasAvx2()) return ChunkMinimaFourLanes(weight, last, n, clock, chunk_min);
  return ChunkMinimaTwoLanes(weight, last, n, clock, chunk_min);
}

}  // namespace remat
