// policies/costly_ops.h over every aten op registered in the installed torch: qualified and unqualified names
// classify alike, the ops that dominate training (products, convolutions, recurrent layers, attention) are costly,
// names that only look like them are cheap, and every aten op whose name suggests a product or convolution is
// classified on purpose (costly, or listed cheap below): a torch that adds one fails here until it is decided.
#include <ATen/core/dispatch/Dispatcher.h>

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/costly_ops.h"

namespace remat {
namespace {

std::set<std::string> AtenOpNames() {
  std::set<std::string> names;
  for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name.starts_with("aten::")) names.insert(op.name.substr(6));
  }
  return names;
}

TEST(CostlyOpsTest, QualifiedAndUnqualifiedNamesAgree) {
  const std::set<std::string> names = AtenOpNames();
  ASSERT_GT(names.size(), 1000u);
  for (const std::string& name : names) {
    EXPECT_EQ(IsCostlyOp("aten::" + name), IsCostlyOp(name)) << name;
    EXPECT_EQ(IsCostlyOp("aten::" + name + ".out"), IsCostlyOp(name)) << name;
  }
  EXPECT_TRUE(IsCostlyOp("remat::compiled_graph"));
  EXPECT_TRUE(IsCostlyOp("mm_mat1_backward"));  // the backward names some traces use
}

TEST(CostlyOpsTest, WhatDominatesTrainingIsCostly) {
  const std::set<std::string> names = AtenOpNames();
  for (const char* name :
       {"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "linear_backward", "_addmm_activation", "_int_mm",
        "_scaled_mm", "einsum", "tensordot", "bilinear", "_trilinear", "convolution", "convolution_backward",
        "_convolution", "conv2d", "conv_transpose2d", "_conv_depthwise2d", "mkldnn_convolution",
        "_slow_conv2d_forward", "slow_conv_dilated2d", "cudnn_convolution", "lstm", "gru", "rnn_tanh",
        "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward", "_thnn_fused_lstm_cell", "mkldnn_linear_backward_weights",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention", "scaled_dot_product_attention", "_weight_int4pack_mm"}) {
    EXPECT_TRUE(names.contains(name)) << name << " is not an aten op of this torch";
    EXPECT_TRUE(IsCostlyOp(name)) << name;
  }
}

// Every aten op whose name contains one of these and that is not costly must be listed here.
const char* const kSuggestive[] = {"conv", "mm", "matmul", "linear", "lstm", "gru", "rnn", "attention", "gemm",
                                   "einsum", "dot"};
const std::set<std::string> kCheapOnPurpose = {
    // resampling
    "__upsample_bilinear", "_upsample_bilinear2d_aa", "_upsample_bilinear2d_aa_backward", "upsample_bilinear2d",
    "upsample_bilinear2d_backward", "upsample_linear1d", "upsample_linear1d_backward", "upsample_trilinear3d",
    "upsample_trilinear3d_backward",
    // conversions, packing, flags
    "_convert_indices_from_coo_to_csr", "_convert_indices_from_csr_to_coo", "_convert_weight_to_int4pack",
    "_convert_weight_to_int4pack_for_cpu", "_cudnn_rnn_flatten_weight", "_use_cudnn_rnn_flatten_weight",
    "_wrapped_linear_prepack", "fbgemm_pack_gemm_matrix_fp16", "fbgemm_pack_quantized_matrix",
    "fbgemm_linear_quantize_weight", "mkldnn_reorder_conv2d_weight", "mkldnn_reorder_conv3d_weight",
    // elementwise or products of vectors
    "_compute_linear_combination", "dot", "vdot", "linalg_vecdot", "linalg_multi_dot",
    // "mm" inside another word (gamma functions, cumulative max/min, windows)
    "_cummax_helper", "_cummin_helper", "cummax", "cummaxmin_backward", "cummin", "_foreach_lgamma",
    "_foreach_lgamma_", "_standard_gamma", "_standard_gamma_grad", "digamma", "digamma_", "gamma", "igamma",
    "igamma_", "igammac", "igammac_", "lgamma", "lgamma_", "mvlgamma", "mvlgamma_", "polygamma", "polygamma_",
    "special_digamma", "special_gammainc", "special_gammaincc", "special_gammaln", "special_multigammaln",
    "special_polygamma", "hamming_window", "_nested_get_jagged_dummy"};

TEST(CostlyOpsTest, EveryOpThatLooksCostlyIsClassifiedOnPurpose) {
  const std::set<std::string> names = AtenOpNames();
  std::vector<std::string> unlisted;
  for (const std::string& name : names) {
    bool suggestive = false;
    for (const char* word : kSuggestive) suggestive = suggestive || name.find(word) != std::string::npos;
    if (suggestive && !IsCostlyOp(name) && !kCheapOnPurpose.contains(name)) unlisted.push_back(name);
  }
  EXPECT_TRUE(unlisted.empty()) << "classify these (costly_ops.cc, or this test's cheap list): "
                                << testing::PrintToString(unlisted);
  for (const std::string& name : kCheapOnPurpose) EXPECT_FALSE(IsCostlyOp(name)) << name;
}

TEST(CostlyOpsTest, CommonCheapOpsAreCheap) {
  for (const char* name : {"relu", "add", "mul", "native_batch_norm", "native_layer_norm", "_softmax", "embedding",
                           "cat", "clone", "gelu_backward", "convert_element_type", "mean.dim", "view"}) {
    EXPECT_FALSE(IsCostlyOp(name)) << name;
  }
}

}  // namespace
}  // namespace remat
