#include "policies/costly_ops.h"

#include <algorithm>
#include <array>

namespace remat {
namespace {

// Words of costly ops' names: products of matrices (not of vectors: dot, mv, outer are cheap), convolutions (and
// any word starting with "conv"), recurrent layers, attention.
constexpr std::array<std::string_view, 22> kCostlyWords = {
    "mm",     "bmm",    "addmm",     "addbmm",  "baddbmm", "matmul", "linear", "bilinear",  "trilinear", "tensordot",
    "einsum", "gemm",   "spmm",      "hspmm",   "smm",     "sspaddmm", "rnn", "lstm",      "gru",       "attention",
    "convolution", "conv"};

// Words that make an op cheap whatever else its name says: resampling, weight packing, quantizing and layout
// conversions, linear combinations of tensors.
constexpr std::array<std::string_view, 8> kCheapWords = {"upsample", "pack",    "prepack",     "flatten",
                                                         "convert",  "reorder", "combination", "quantize"};

}  // namespace

bool IsCostlyOp(std::string_view name) {
  if (const std::size_t ns = name.rfind("::"); ns != std::string_view::npos) {
    name.remove_prefix(ns + 2);
  }
  if (const std::size_t dot = name.find('.'); dot != std::string_view::npos) name = name.substr(0, dot);
  if (name == "compiled_graph") return true;  // remat::compiled_graph: a torch.compile'd graph's call
  bool costly = false;
  while (!name.empty()) {
    const std::size_t end = std::min(name.find('_'), name.size());
    const std::string_view word = name.substr(0, end);
    name.remove_prefix(std::min(end + 1, name.size()));
    if (word.empty()) continue;
    if (std::find(kCheapWords.begin(), kCheapWords.end(), word) != kCheapWords.end()) return false;
    const bool conv = word.starts_with("conv") && !word.starts_with("convert");
    costly = costly || conv || std::find(kCostlyWords.begin(), kCostlyWords.end(), word) != kCostlyWords.end();
  }
  return costly;
}

}  // namespace remat
