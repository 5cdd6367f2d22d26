// Process-wide settings that choose what a kernel computes, captured with each recorded op and put back for its
// replay.
//
// A kernel's result depends on more than its arguments: the default dtype (a factory op without a dtype, an integer
// tensor divided by a Python float), the intra-op thread count (a full reduction's partial sums), and the flags that
// choose a backend or a precision (oneDNN on or off for a convolution, cuDNN's deterministic and benchmark modes,
// TF32, the scaled-dot-product-attention backends, deterministic algorithms). A program may change them for a part
// of a step: `with torch.backends.mkldnn.flags(enabled=False)` around some layers, `torch.set_default_dtype` inside
// a block, `torch.backends.cudnn.flags(enabled=False)` for a double backward. A replay runs later, under whatever the
// program has set by then, so it must run under the settings of its capture, or it computes something else (a
// different convolution backend: different bits; a different default dtype: a different size).
//
// Capture reads each setting (a few getters, no allocation). A replay whose settings equal the current ones changes
// nothing; otherwise KernelSettingsScope sets the captured values and restores the current ones when it ends. The
// settings are process-wide (the thread count is the calling thread's): another thread running ops during such a
// replay sees them too, as it would see the program's own change. In a forked child a replay never raises the
// thread count (OpenMP's threads do not survive fork(): a wider parallel region would hang there).
#pragma once

#include <cstdint>

namespace remat::integration {

struct KernelSettings {
  std::int8_t default_dtype = 0;  // c10::ScalarType
  std::int16_t num_threads = 0;  // at::get_num_threads() on the capturing thread
  std::uint32_t flags = 0;       // one bit per boolean setting (kernel_settings.cc: kFlags)
  std::uint32_t precisions = 0;  // the float32 precision per backend and op, four bits each (kPrecisions)
  std::uint8_t cublas_reductions = 0;  // at::CuBLASReductionOption for fp16 (bits 0-1) and bf16 (bits 2-3)
  // Whether `precisions` was captured: only for ops whose kernels read it (OpTraits::reads_float32_precision),
  // since each is a map lookup in torch (about 185 instructions) and every op is captured.
  bool has_precisions = false;

  static KernelSettings Capture(bool with_precisions);
  friend bool operator==(const KernelSettings&, const KernelSettings&) = default;
};

// Puts `captured` in force while it lives, if it differs from the settings now; restores them at the end.
class KernelSettingsScope {
 public:
  explicit KernelSettingsScope(const KernelSettings& captured);
  ~KernelSettingsScope();
  KernelSettingsScope(const KernelSettingsScope&) = delete;
  KernelSettingsScope& operator=(const KernelSettingsScope&) = delete;

 private:
  KernelSettings previous_;
  bool changed_ = false;
};

}  // namespace remat::integration
