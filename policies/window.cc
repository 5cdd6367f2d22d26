#include "policies/window.h"

#include <limits>

namespace remat {
namespace {

class Dte final : public Policy {
 public:
  std::string_view name() const override { return "dte"; }
  PolicyFeatures features() const override { return {.eq_classes = true, .addresses = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    return CostDensity(v.Compute(s) + v.EqClassCompute(s), v.Bytes(s) + v.AdjacentFreeBytes(s),
                       v.Clock() - v.LastAccess(s));
  }
};

class Coop final : public Policy {
 public:
  std::string_view name() const override { return "coop"; }
  PolicyFeatures features() const override { return {.addresses = true}; }
  double Score(const StorageView& v, StorageId s) const override {
    std::int64_t staleness = v.Clock() - v.LastAccess(s);
    if (staleness <= 0) return std::numeric_limits<double>::infinity();
    return static_cast<double>(v.Compute(s) + v.EvictedNeighbourCompute(s)) / static_cast<double>(staleness);
  }
  // The same numerator as Score, so W / staleness (double) is Score bit for bit.
  bool HasStalenessWeight() const override { return true; }
  double StalenessWeight(const StorageView& v, StorageId s) const override {
    return static_cast<double>(v.Compute(s) + v.EvictedNeighbourCompute(s));
  }
  bool UsesWindows() const override { return true; }
  std::optional<double> WindowCost(const StorageView& v, StorageId s) const override {
    if (!v.Evictable(s)) return std::nullopt;
    double cost = Score(v, s);
    // A just-produced storage (staleness 0) is as good as pinned for this op: make it a barrier.
    if (cost == std::numeric_limits<double>::infinity()) return std::nullopt;
    return cost;
  }
};

}  // namespace

std::unique_ptr<Policy> MakeDtePolicy() { return std::make_unique<Dte>(); }
std::unique_ptr<Policy> MakeCoopPolicy() { return std::make_unique<Coop>(); }

bool IsCostlyOp(std::string_view name) {
  // Qualified ("aten::mm.out") or not ("mm", as in the DTR traces): compare the base name.
  if (const std::size_t ns = name.rfind("::"); ns != std::string_view::npos) name.remove_prefix(ns + 2);
  if (const std::size_t dot = name.find('.'); dot != std::string_view::npos) name = name.substr(0, dot);
  static constexpr std::string_view kCostly[] = {
      "mm", "bmm", "addmm", "addbmm", "baddbmm", "_addmm_activation", "matmul", "linear", "mkldnn_linear",
      "_convolution", "_convolution_double_backward", "cudnn_convolution", "cudnn_convolution_backward",
      "cudnn_convolution_transpose", "cudnn_convolution_transpose_backward", "mkldnn_convolution",
      "miopen_convolution", "_slow_conv2d_forward", "_slow_conv2d_backward", "slow_conv3d", "slow_conv_transpose2d",
      "_nnpack_spatial_convolution", "thnn_conv2d",
      // remat::compiled_graph: a call of a torch.compile'd graph (a block's whole forward when replayed)
      "compiled_graph"};
  for (std::string_view costly : kCostly) {
    if (name == costly) return true;
  }
  // conv1d/2d/3d, conv_transpose*, conv_tbc, convolution, convolution_backward, convolution_overrideable, and the
  // backward ops of the above ("mm_mat1_backward" style names some traces use).
  // Not convert_element_type (prims' dtype cast) nor the aten::_convert_* family (a leading underscore).
  return (name.starts_with("conv") && !name.starts_with("convert")) || name.starts_with("mm_") ||
         name.starts_with("bmm_") ||
         name.starts_with("addmm_") || name.starts_with("matmul_") || name.starts_with("linear_");
}

}  // namespace remat
