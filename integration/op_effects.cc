// Op effects: see op_effects.h for the contract.
#include "integration/op_effects.h"

#include <algorithm>
#include <array>


namespace remat::integration {
namespace {

// The attention kernels with a dropout_p draw their dropout from the default generator of their device (CUDA's
// Philox state; their backward takes the seed and offset they return, so it is not random).
constexpr std::array<std::string_view, 19> kGeneratorlessRandomOps = {
    "aten::native_dropout",
    "aten::dropout",
    "aten::dropout_",
    "aten::feature_dropout",
    "aten::feature_dropout_",
    "aten::alpha_dropout",
    "aten::alpha_dropout_",
    "aten::feature_alpha_dropout",
    "aten::feature_alpha_dropout_",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
    "aten::_cudnn_attention_forward",
    "aten::_fill_mem_eff_dropout_mask_",
    "aten::_triton_scaled_dot_attention",
};

// Calls that write an argument they do not return and compute their outputs without its value (`when_true`: the
// index of the bool argument that must be true, -1 for every call): the batch norms in training mode (the only mode
// in which the unannotated ones write running_mean/running_var; `_native_batch_norm_legit` reads them in eval mode
// although its schema marks them written) and rrelu (its noise is drawn anew in training mode, unused otherwise).
struct SideWriteExemption {
  std::string_view op;
  int when_true;
};
constexpr std::array<SideWriteExemption, 6> kOutputsIgnoreSideWrites = {{{"aten::native_batch_norm", 5},
                                                                        {"aten::cudnn_batch_norm", 5},
                                                                        {"aten::miopen_batch_norm", 5},
                                                                        {"aten::_native_batch_norm_legit", 5},
                                                                        {"aten::_batch_norm_with_update", -1},
                                                                        {"aten::rrelu_with_noise", -1}}};

constexpr std::array<std::string_view, 4> kSideEffectNamespaces = {"c10d::", "_c10d_functional::",
                                                                   "c10d_functional::", "profiler::"};

constexpr std::array<std::string_view, 5> kUninitializedPrefixes = {"aten::empty", "aten::new_empty",
                                                                    "aten::_empty", "aten::set_", "aten::resize"};

constexpr std::array<std::string_view, 11> kOverwritesSelf = {
    "aten::fill_",   "aten::zero_",   "aten::copy_",        "aten::bernoulli_", "aten::uniform_",
    "aten::normal_", "aten::random_", "aten::exponential_", "aten::geometric_", "aten::cauchy_",
    "aten::log_normal_"};

template <std::size_t N>
bool Contains(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

const std::vector<UnannotatedWrite>& UnannotatedWrites() {
  // (input, weight, bias, running_mean, running_var, training, momentum, eps): in training mode the kernel updates
  // running_mean (3) and running_var (4) in place; its outputs use the batch statistics only.
  static const auto* table = new std::vector<UnannotatedWrite>{
      {"aten::native_batch_norm", {3, 4}, 5},
      {"aten::cudnn_batch_norm", {3, 4}, 5},
      {"aten::miopen_batch_norm", {3, 4}, 5},
  };
  return *table;
}

std::vector<int> UnannotatedWritesOfCall(std::string_view op_base_name, const std::vector<c10::IValue>& arguments) {
  for (const UnannotatedWrite& entry : UnannotatedWrites()) {
    if (entry.op != op_base_name) continue;
    if (entry.when_true >= 0) {
      const auto index = static_cast<std::size_t>(entry.when_true);
      if (index >= arguments.size() || !arguments[index].isBool() || !arguments[index].toBool()) return {};
    }
    std::vector<int> written;
    for (const int a : entry.arguments) {
      const auto index = static_cast<std::size_t>(a);
      if (index < arguments.size() && arguments[index].isTensor() && arguments[index].toTensor().defined()) {
        written.push_back(a);
      }
    }
    return written;
  }
  return {};
}

bool IsGeneratorlessRandomOp(std::string_view op_base_name) {
  return Contains(kGeneratorlessRandomOps, op_base_name);
}

bool HasExternalEffects(std::string_view op_base_name) {
  return std::any_of(kSideEffectNamespaces.begin(), kSideEffectNamespaces.end(),
                     [&](std::string_view prefix) { return op_base_name.starts_with(prefix); });
}

bool OutputsIgnoreSideWrites(std::string_view op_base_name, const std::vector<c10::IValue>& arguments) {
  for (const SideWriteExemption& entry : kOutputsIgnoreSideWrites) {
    if (entry.op != op_base_name) continue;
    if (entry.when_true < 0) return true;
    const auto index = static_cast<std::size_t>(entry.when_true);
    return index < arguments.size() && arguments[index].isBool() && arguments[index].toBool();
  }
  return false;
}

bool ProducesUninitializedMemory(std::string_view op_base_name) {
  return std::any_of(kUninitializedPrefixes.begin(), kUninitializedPrefixes.end(),
                     [&](std::string_view prefix) { return op_base_name.starts_with(prefix); });
}

bool OverwritesSelf(std::string_view op_base_name) { return Contains(kOverwritesSelf, op_base_name); }

}  // namespace remat::integration
