// GradientWatch: see gradient_watch.h.
#include "integration/gradient_watch.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/node.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <utility>

namespace remat::integration {
namespace {

// Runs after AccumulateGrad: the leaf's .grad is the accumulated gradient.
class AccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  AccumulatedHook(c10::weak_intrusive_ptr<c10::TensorImpl> leaf, const std::function<void(c10::StorageImpl*)>* report)
      : leaf_(std::move(leaf)), report_(report) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    c10::intrusive_ptr<c10::TensorImpl> impl = leaf_.lock();
    if (!impl) return outputs;
    const at::Tensor leaf(std::move(impl));
    const at::Tensor& grad = leaf.grad();
    if (grad.defined() && grad.has_storage()) (*report_)(grad.storage().unsafeGetStorageImpl());
    return outputs;
  }

 private:
  c10::weak_intrusive_ptr<c10::TensorImpl> leaf_;
  const std::function<void(c10::StorageImpl*)>* report_;  // the watch's, which removes this hook first
};

}  // namespace

struct GradientWatch::Hooked {
  c10::intrusive_ptr<torch::autograd::Node> accumulator;
  std::uintptr_t key;
};

GradientWatch::GradientWatch(std::function<void(c10::StorageImpl*)> on_gradient)
    : on_gradient_(std::move(on_gradient)) {}

GradientWatch::~GradientWatch() {
  for (Hooked& h : hooks_) h.accumulator->del_post_hook(h.key);
}

void GradientWatch::Watch(const at::Tensor& t) {
  if (!t.defined() || !t.requires_grad() || !t.is_leaf()) return;
  if (!seen_.insert(t.unsafeGetTensorImpl()).second) return;
  c10::intrusive_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(t);
  if (!accumulator) return;
  const std::uintptr_t key = accumulator->add_post_hook(std::make_unique<AccumulatedHook>(
      c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), &on_gradient_));
  hooks_.push_back(Hooked{std::move(accumulator), key});
}

std::size_t GradientWatch::watched() const { return hooks_.size(); }

}  // namespace remat::integration
