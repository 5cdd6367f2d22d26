// Platform probe: proves that the stock torch wheel lets remat see every op, forward and backward, through a
// boxed fallback on a dispatch key held in the thread-local included set (DESIGN.md, "PyTorch integration").
// If a torch upgrade breaks any of these facts, the integration strategy must change; this test says which.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {

constexpr c10::DispatchKey kProbeKey = c10::DispatchKey::DeferredInit;

std::mutex seen_mutex;
std::set<std::string> seen_ops;
std::set<std::thread::id> seen_threads;

void RecordingFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  {
    std::lock_guard<std::mutex> lock(seen_mutex);
    seen_ops.insert(op.schema().name());
    seen_threads.insert(std::this_thread::get_id());
  }
  // Pass through: continue with every key below ours.
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kProbeKey), stack);
}

TEST(TorchProbe, FallbackOnThreadLocalKeySeesForwardAndBackwardOps) {
  auto& dispatcher = c10::Dispatcher::singleton();
  ASSERT_FALSE(dispatcher.hasBackendFallbackForDispatchKey(kProbeKey))
      << "torch already registers a fallback on " << kProbeKey << "; pick the other candidate key";
  auto registration = dispatcher.registerFallback(
      kProbeKey, c10::KernelFunction::makeFromBoxedFunction<&RecordingFallback>(), "remat torch probe");
  ASSERT_TRUE(dispatcher.hasBackendFallbackForDispatchKey(kProbeKey));

  at::Tensor x = at::ones({4, 4}).set_requires_grad(true);
  at::Tensor w = at::ones({4, 4}).set_requires_grad(true);
  {
    c10::impl::IncludeDispatchKeyGuard include(kProbeKey);
    at::Tensor loss = at::sum(at::relu(at::mm(x, w)));
    loss.backward();
  }
  std::lock_guard<std::mutex> lock(seen_mutex);
  EXPECT_TRUE(seen_ops.count("aten::mm")) << "forward matmul not seen";
  EXPECT_TRUE(seen_ops.count("aten::relu")) << "forward relu not seen";
  // Backward ops are run by autograd's engine; the included key set travels with the graph task.
  EXPECT_TRUE(seen_ops.count("aten::threshold_backward")) << "backward of relu not seen";
  ASSERT_TRUE(w.grad().defined());
  // d(sum(relu(x@w)))/dw = x^T @ 1 = 4 everywhere for all-ones inputs: the fallback changed no result.
  EXPECT_EQ(w.grad().sum().item<float>(), 64.0f);
}

TEST(TorchProbe, KeyOutsideTheIncludedSetSeesNothing) {
  auto registration = c10::Dispatcher::singleton().registerFallback(
      kProbeKey, c10::KernelFunction::makeFromBoxedFunction<&RecordingFallback>(), "remat torch probe");
  {
    std::lock_guard<std::mutex> lock(seen_mutex);
    seen_ops.clear();
  }
  at::Tensor y = at::relu(at::ones({2, 2}));
  std::lock_guard<std::mutex> lock(seen_mutex);
  EXPECT_TRUE(seen_ops.empty()) << "the fallback ran without the key in the thread-local set";
}

}  // namespace
