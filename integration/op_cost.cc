// Estimated op cost: see op_cost.h.
#include "integration/op_cost.h"

#include <ATen/core/List.h>

#include <string_view>

#include "integration/op_capture.h"

namespace remat::integration {
namespace {

constexpr double kDispatchNs = 1000.0;
constexpr double kNsPerByte = 0.1;   // 10 GB/s
constexpr double kNsPerFlop = 0.05;  // 20 GFLOP/s

double Numel(c10::IntArrayRef sizes) {
  double n = 1;
  for (const std::int64_t s : sizes) n *= static_cast<double>(s);
  return n;
}

const at::Tensor* TensorArgument(const OpRecord& record, std::size_t i) {
  if (i >= record.arguments.size() || !record.arguments[i].isTensor()) return nullptr;
  const at::Tensor& t = record.arguments[i].toTensor();
  return t.defined() && StridedOverStorage(t) ? &t : nullptr;
}

// A sparse or nested argument counts nothing: it has no nbytes of its own (torch throws), and the estimate is only
// a ranking of costs.
double BytesOf(const at::Tensor& t) {
  return t.defined() && StridedOverStorage(t) ? static_cast<double>(t.nbytes()) : 0;
}

// 2 x multiply-adds of the matrix products among the ops that dominate training; 0 for the rest.
double Flops(const OpRecord& record) {
  const std::string_view name = record.op.schema().name();
  const at::Tensor* a = nullptr;
  const at::Tensor* b = nullptr;
  if (name == "aten::mm" || name == "aten::bmm") {
    a = TensorArgument(record, 0);
    b = TensorArgument(record, 1);
  } else if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm") {
    a = TensorArgument(record, 1);
    b = TensorArgument(record, 2);
  } else if (name == "aten::convolution" || name == "aten::_convolution" || name == "aten::convolution_backward") {
    // Output elements x (input channels / groups x kernel elements); backward does about twice the forward work.
    const at::Tensor* weight = TensorArgument(record, name == "aten::convolution_backward" ? 2 : 1);
    if (weight == nullptr || record.outputs.empty() || weight->dim() < 2) return 0;
    const double per_output = static_cast<double>(weight->numel()) / static_cast<double>(weight->size(0));
    double outputs = 0;
    for (const CapturedOutput& out : record.outputs) outputs = std::max(outputs, Numel(out.meta.sizes));
    return 2.0 * outputs * per_output * (name == "aten::convolution_backward" ? 2.0 : 1.0);
  }
  if (a == nullptr || b == nullptr || a->dim() < 2 || b->dim() < 2) return 0;
  // (..., n, k) x (..., k, m): numel(a) x m multiply-adds.
  return 2.0 * static_cast<double>(a->numel()) * static_cast<double>(b->size(-1));
}

double Bytes(const OpRecord& record) {
  double bytes = 0;
  for (const c10::IValue& value : record.arguments) {
    if (value.isTensor()) {
      bytes += BytesOf(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) bytes += BytesOf(t);
    }
  }
  for (const CapturedOutput& out : record.outputs) {
    bytes += Numel(out.meta.sizes) * static_cast<double>(c10::elementSize(out.meta.dtype));
  }
  return bytes;
}

}  // namespace

std::int64_t EstimatedCostNs(const OpRecord& record) {
  return static_cast<std::int64_t>(kDispatchNs + kNsPerByte * Bytes(record) + kNsPerFlop * Flops(record));
}

}  // namespace remat::integration
