// A test workload for the engine bridge: y[i] = tanh(sin(y[i-1]) * 1.5), with an in-place multiply and a dropout
// every third step, so that a chain of 64 KiB-sized storages has views, in-place writes and random ops on it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tanh.h>

#include <vector>

namespace remat::integration {

// `dropout` false: no random op (no generator shared between threads running chains at once).
inline std::vector<at::Tensor> Chain(const at::Tensor& x, int n, bool dropout = true) {
  std::vector<at::Tensor> ys;
  at::Tensor y = x;
  for (int i = 0; i < n; ++i) {
    at::Tensor s = at::sin(y);
    s.mul_(1.5);
    y = at::tanh(s);
    if (dropout && i % 3 == 2) y = at::dropout(y, 0.25, /*train=*/true);
    ys.push_back(y);
  }
  return ys;
}

}  // namespace remat::integration
