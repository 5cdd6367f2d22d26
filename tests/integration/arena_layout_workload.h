// Test workloads that leave an arena laid out so that the engine must move memory, shared by the CPU bridge tests
// (engine_bridge_test) and the same scenarios on a CUDA device's arena (tests/cuda/cuda_engine_test). Both start
// with remat enabled under the budget the comments name, and `small` (128 x 128 floats, 64 KiB) made outside the
// arena.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tanh.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace remat::integration {

// Under a budget of ten 64 KiB blocks: five constants (aten::empty results written behind the hook's back, so remat
// can neither evict nor recompute them) alternate with five activations, which are then dropped. 320 KiB are free
// in 64 KiB holes, so a 128 KiB result needs a constant moved out of the way.
struct ConstantsBetweenHoles {
  std::vector<at::Tensor> constants;
  std::vector<const void*> addresses;  // where each constant was before anything moved

  static ConstantsBetweenHoles Make(const at::Tensor& small) {
    ConstantsBetweenHoles out;
    std::vector<at::Tensor> activations;
    for (int i = 0; i < 5; ++i) {
      out.constants.push_back(at::empty({64 * 1024}, at::kByte));
      std::memset(out.constants.back().data_ptr(), 'a' + i, 64 * 1024);
      activations.push_back(at::sin(small));
    }
    for (const at::Tensor& c : out.constants) out.addresses.push_back(c.const_data_ptr());
    return out;  // the activations die here: released, evicted at once
  }

  // Every constant kept its bytes; returns how many moved.
  int ExpectBytesKept() const {
    int moved = 0;
    for (int i = 0; i < 5; ++i) {
      moved += constants[i].const_data_ptr() != addresses[i];
      const auto* bytes = static_cast<const unsigned char*>(constants[i].const_data_ptr());
      EXPECT_EQ(std::count(bytes, bytes + 64 * 1024, static_cast<unsigned char>('a' + i)), 64 * 1024) << i;
    }
    return moved;
  }
};

// Under a budget of three 64 KiB blocks: x sits between two holes of 64 KiB (its neighbours died), so 128 KiB are
// free but no hole holds them. `base` is where the first hole starts; callers ASSERT `laid_out` (x landed between
// its two neighbours) before they rely on the layout.
struct InputBetweenHoles {
  at::Tensor x;
  std::uintptr_t base = 0;
  bool laid_out = false;

  static InputBetweenHoles Make(const at::Tensor& small) {
    InputBetweenHoles out;
    at::Tensor a = at::tanh(small);
    out.x = at::sin(small);
    at::Tensor b = at::tanh(small);
    out.base = reinterpret_cast<std::uintptr_t>(a.const_data_ptr());
    out.laid_out = reinterpret_cast<std::uintptr_t>(out.x.const_data_ptr()) == out.base + 64 * 1024 &&
                   reinterpret_cast<std::uintptr_t>(b.const_data_ptr()) == out.base + 128 * 1024;
    a = at::Tensor();
    b = at::Tensor();
    (void)at::sin(small);  // the next op sees that a and b died: their blocks are freed (its result goes at once)
    return out;
  }
};

}  // namespace remat::integration
