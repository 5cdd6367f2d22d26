// SameBytes: what "identical" means in remat (DESIGN.md, "Soundness": the oracle): two tensors have the same dtype,
// shape and device and every byte of their values is equal, as memcmp says (-0.0 differs from 0.0, NaNs are
// compared by their bits). Views and strides do not matter: the values are compared in logical order. CPU tensors
// only (others are copied to the CPU first). The comparison itself is an op (aten::equal on the bytes), so under remat
// an evicted tensor is brought back to be compared. The Python counterpart is tests/python/oracle.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>

namespace remat::integration {

inline bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes() || a.device() != b.device()) return false;
  auto bytes = [](const at::Tensor& t) { return t.cpu().contiguous().reshape({-1}).view(at::kByte); };
  return at::equal(bytes(a), bytes(b));
}

}  // namespace remat::integration
