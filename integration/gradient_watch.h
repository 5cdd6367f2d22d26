// GradientWatch: tells its owner about every gradient autograd accumulates into a watched leaf tensor (a
// parameter), right after AccumulateGrad ran.
//
// Why: a parameter's gradient is read by the optimizer step, and once the first parameter changes nothing computed
// from the old values can be recomputed. Recomputing an evicted gradient before that means replaying the backward
// pass up to it (and the forward pass its inputs come from) under the very budget that evicted it; so the engine
// bridge evicts a gradient only when nothing else can go (Engine::Defer; engine_bridge.h).
//
// Watch(leaf) adds a post hook to the leaf's gradient accumulator (the AccumulateGrad node, kept alive by the
// watch as DDP keeps its own) once per leaf; the hook calls `on_gradient` with the StorageImpl of leaf.grad(), on
// the thread that ran the accumulation (autograd's). Hooks are removed when the watch is destroyed. Watch is called
// with the bridge's lock held, and so is `on_gradient` (its caller takes it): not thread-safe by itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace remat::integration {

class GradientWatch {
 public:
  explicit GradientWatch(std::function<void(c10::StorageImpl*)> on_gradient);
  ~GradientWatch();
  GradientWatch(const GradientWatch&) = delete;
  GradientWatch& operator=(const GradientWatch&) = delete;

  // `t` is a leaf that requires grad: from now on its accumulated gradients are reported. Others are ignored.
  void Watch(const at::Tensor& t);
  std::size_t watched() const;

 private:
  struct Hooked;
  std::function<void(c10::StorageImpl*)> on_gradient_;
  absl::flat_hash_set<const c10::TensorImpl*> seen_;
  std::vector<Hooked> hooks_;
};

}  // namespace remat::integration
