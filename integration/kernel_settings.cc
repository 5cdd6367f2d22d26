// KernelSettings: what kernel_settings.h lists, read through at::globalContext() and put back with its setters.
#include "integration/kernel_settings.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <utility>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <c10/core/ScalarTypeToTypeMeta.h>

namespace remat::integration {
namespace {

using Getter = bool (at::Context::*)() const;
using Setter = void (at::Context::*)(bool);

// The boolean settings, one bit each (bit i is kFlags[i]). Only plain fields: the TF32 getters of the legacy API
// (allowTF32CuBLAS, allowTF32CuDNN without an op) throw when a program mixed the legacy and the new API, so the
// precisions are read per backend and op below instead.
constexpr std::array<std::pair<Getter, Setter>, 14> kFlags = {{
    {&at::Context::userEnabledMkldnn, &at::Context::setUserEnabledMkldnn},
    {&at::Context::deterministicMkldnn, &at::Context::setDeterministicMkldnn},
    {&at::Context::userEnabledNNPACK, &at::Context::setUserEnabledNNPACK},
    {&at::Context::userEnabledCuDNN, &at::Context::setUserEnabledCuDNN},
    {&at::Context::benchmarkCuDNN, &at::Context::setBenchmarkCuDNN},
    {&at::Context::deterministicCuDNN, &at::Context::setDeterministicCuDNN},
    {&at::Context::deterministicFillUninitializedMemory, &at::Context::setDeterministicFillUninitializedMemory},
    {&at::Context::userEnabledFlashSDP, &at::Context::setSDPUseFlash},
    {&at::Context::userEnabledMemEfficientSDP, &at::Context::setSDPUseMemEfficient},
    {&at::Context::userEnabledMathSDP, &at::Context::setSDPUseMath},
    {&at::Context::userEnabledCuDNNSDP, &at::Context::setSDPUseCuDNN},
    {&at::Context::allowFP16BF16ReductionMathSDP, &at::Context::setAllowFP16BF16ReductionMathSDP},
    {&at::Context::allowFP16ReductionCPU, &at::Context::setAllowFP16ReductionCPU},
    {&at::Context::allowFP16AccumulationCuBLAS, &at::Context::setAllowFP16AccumulationCuBLAS},
}};
// Deterministic algorithms are set with their warn-only mode: two more bits.
constexpr int kDeterministicBit = kFlags.size();
constexpr int kWarnOnlyBit = kFlags.size() + 1;

// The float32 precisions a kernel asks for (cuDNN convolutions and RNNs, cuBLAS, oneDNN), four bits each.
constexpr std::array<std::pair<at::Float32Backend, at::Float32Op>, 6> kPrecisions = {{
    {at::Float32Backend::CUDA, at::Float32Op::CONV},
    {at::Float32Backend::CUDA, at::Float32Op::RNN},
    {at::Float32Backend::CUDA, at::Float32Op::MATMUL},
    {at::Float32Backend::MKLDNN, at::Float32Op::CONV},
    {at::Float32Backend::MKLDNN, at::Float32Op::RNN},
    {at::Float32Backend::MKLDNN, at::Float32Op::MATMUL},
}};

// Set in a forked child (a DataLoader worker). There a replay may lower the thread count but never raise it:
// OpenMP's threads did not survive fork(), and a parallel region with more than one thread in the child hangs
// (torch sets a worker's count to 1 for that reason).
std::atomic<bool> in_forked_child{false};

void WatchForFork() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { in_forked_child.store(true, std::memory_order_relaxed); });
    return true;
  }();
  (void)registered;
}

void Apply(const KernelSettings& s) {
  at::Context& context = at::globalContext();
  for (std::size_t i = 0; i < kFlags.size(); ++i) (context.*kFlags[i].second)((s.flags >> i & 1u) != 0);
  context.setDeterministicAlgorithms((s.flags >> kDeterministicBit & 1u) != 0,
                                     (s.flags >> kWarnOnlyBit & 1u) != 0);
  for (std::size_t i = 0; s.has_precisions && i < kPrecisions.size(); ++i) {
    const auto precision = static_cast<at::Float32Precision>(s.precisions >> (4 * i) & 0xfu);
    context.setFloat32Precision(kPrecisions[i].first, kPrecisions[i].second, precision);
  }
  const auto fp16 = static_cast<at::CuBLASReductionOption>(s.cublas_reductions & 3u);
  const auto bf16 = static_cast<at::CuBLASReductionOption>(s.cublas_reductions >> 2 & 3u);
  context.setAllowFP16ReductionCuBLAS(fp16 == at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK,
                                      fp16 != at::CuBLASReductionOption::DisallowReducedPrecisionDisallowSplitK);
  context.setAllowBF16ReductionCuBLAS(bf16 == at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK,
                                      bf16 != at::CuBLASReductionOption::DisallowReducedPrecisionDisallowSplitK);
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(s.default_dtype)));
  const int threads = at::get_num_threads();
  if (s.num_threads != threads && (s.num_threads < threads || !in_forked_child.load(std::memory_order_relaxed))) {
    at::set_num_threads(s.num_threads);
  }
}

}  // namespace

KernelSettings KernelSettings::Capture(bool with_precisions) {
  WatchForFork();
  const at::Context& context = at::globalContext();
  KernelSettings s;
  s.default_dtype = static_cast<std::int8_t>(c10::get_default_dtype_as_scalartype());
  s.num_threads = static_cast<std::int16_t>(at::get_num_threads());
  for (std::size_t i = 0; i < kFlags.size(); ++i) {
    s.flags |= static_cast<std::uint32_t>((context.*kFlags[i].first)()) << i;
  }
  s.flags |= static_cast<std::uint32_t>(context.deterministicAlgorithms()) << kDeterministicBit;
  s.flags |= static_cast<std::uint32_t>(context.deterministicAlgorithmsWarnOnly()) << kWarnOnlyBit;
  s.has_precisions = with_precisions;
  for (std::size_t i = 0; with_precisions && i < kPrecisions.size(); ++i) {
    const at::Float32Precision precision = context.float32Precision(kPrecisions[i].first, kPrecisions[i].second);
    s.precisions |= (static_cast<std::uint32_t>(precision) & 0xfu) << (4 * i);
  }
  const auto fp16 = static_cast<unsigned>(context.allowFP16ReductionCuBLAS()) & 3u;
  const auto bf16 = static_cast<unsigned>(context.allowBF16ReductionCuBLAS()) & 3u;
  s.cublas_reductions = static_cast<std::uint8_t>(fp16 | bf16 << 2);
  return s;
}

KernelSettingsScope::KernelSettingsScope(const KernelSettings& captured)
    : previous_(KernelSettings::Capture(captured.has_precisions)) {
  if (previous_ == captured) return;
  Apply(captured);
  changed_ = true;
}

KernelSettingsScope::~KernelSettingsScope() {
  if (changed_) Apply(previous_);
}

}  // namespace remat::integration
