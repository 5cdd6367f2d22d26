// Costly ops: the one classification of ops by name into costly (matrix products, convolutions, recurrent layers,
// attention: their outputs are expensive to recompute) and cheap (everything else), used by Coop's cheap-tensor
// partitioning (policies/window.h), the engine's per-op flag (Engine::OpCostly) and the simulator's placement.
//
// Names come qualified from the PyTorch path ("aten::mm.out", "aten::_scaled_dot_product_flash_attention_for_cpu")
// and unqualified from traces ("mm", "cudnn_convolution_backward", "mm_mat1_backward"); both classify alike. The rule
// works on the base name's underscore-separated words, so that a word inside another ("bilinear" in
// "upsample_bilinear2d", "conv" in "_convert_indices_from_coo_to_csr", "mm" in "gamma") never matches:
//   costly: a word naming a product of matrices (mm, bmm, addmm, matmul, linear, einsum, gemm, ...; not of vectors:
//     dot, mv, outer stay cheap), a word starting with "conv" (conv2d, convolution, conv_transpose3d; not "convert"),
//     a recurrent layer (rnn, lstm, gru), attention; and remat::compiled_graph (a block's whole forward, replayed);
//   cheap after all: resampling (upsample), weight packing, quantizing and layout conversions (pack, prepack,
//     flatten, quantize, convert, reorder), linear combinations of tensors.
// tests/integration/costly_ops_test.cc runs it over every aten op registered in the installed torch.
#pragma once

#include <string_view>

namespace remat {

bool IsCostlyOp(std::string_view op_name);

}  // namespace remat
