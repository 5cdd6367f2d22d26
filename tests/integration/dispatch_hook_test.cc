// Dispatch hook: the key choice, what a record captures (random ops, in-place and out= ops, views), that only
// outermost ops are recorded, that backward ops are seen, and that replays reproduce random ops bit for bit
// without moving the user's random stream.
#include "integration/dispatch_hook.h"
#include "integration/op_effects.h"
#include "integration/storage_eviction.h"
#include "integration/same_bytes.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_native_batch_norm_legit.h>
#include <ATen/ops/_pad_packed_sequence.h>
#include <ATen/ops/add.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/fused_moving_avg_obs_fake_quant.h>
#include <ATen/ops/max.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/native_channel_shuffle.h>
#include <ATen/ops/mish_backward.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/rrelu_with_noise.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// From ATen/autocast_mode.h, which includes ATen/ATen.h; same declarations.
namespace at::autocast {
TORCH_API void set_autocast_enabled(at::DeviceType device_type, bool enabled);
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
TORCH_API void set_autocast_dtype(at::DeviceType device_type, at::ScalarType dtype);
}  // namespace at::autocast

namespace remat::integration {
namespace {

using ::testing::ElementsAre;

class KeepingObserver : public OpObserver {
 public:
  void BeforeOp(OpRecord& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++before_;
    open_at_op_.push_back(open_composites_);
  }
  void AfterOp(OpRecord&& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.push_back(std::make_shared<OpRecord>(std::move(record)));
  }
  void OpFailed(OpRecord&) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++failed_;
  }
  // Composites: the storages each was begun with; how many are open now and were open when each op was recorded.
  struct Composite {
    std::vector<c10::StorageImpl*> read_raw, passed_on;
  };
  void BeginComposite(std::span<c10::StorageImpl* const> read_raw, std::span<c10::StorageImpl* const> passed_on,
                      CompositeHold& hold) override {
    std::lock_guard<std::mutex> lock(mutex_);
    composites_.push_back({{read_raw.begin(), read_raw.end()}, {passed_on.begin(), passed_on.end()}});
    hold.held.emplace_back(this, static_cast<std::uint32_t>(composites_.size()));
    ++open_composites_;
  }
  void EndComposite(CompositeHold& hold) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_EQ(hold.held.size(), 1u);
    --open_composites_;
  }
  std::vector<Composite> composites() {
    std::lock_guard<std::mutex> lock(mutex_);
    return composites_;
  }
  int open_composites() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_composites_;
  }
  std::vector<int> open_composites_at_each_op() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_at_op_;
  }
  std::vector<std::string> Names() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> names;
    for (const auto& r : records_) names.push_back(r->traits->name);
    return names;
  }
  std::shared_ptr<OpRecord> Only(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<OpRecord> found;
    for (const auto& r : records_) {
      if (r->traits->name != name) continue;
      EXPECT_EQ(found, nullptr) << name << " recorded twice";
      found = r;
    }
    EXPECT_NE(found, nullptr) << name << " not recorded";
    return found;
  }
  std::vector<std::shared_ptr<OpRecord>> All(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<OpRecord>> found;
    for (const auto& r : records_) {
      if (r->traits->name == name) found.push_back(r);
    }
    return found;
  }
  int before() {
    std::lock_guard<std::mutex> lock(mutex_);
    return before_;
  }
  int failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<OpRecord>> records_;
  int before_ = 0;
  int failed_ = 0;
  std::vector<Composite> composites_;
  int open_composites_ = 0;
  std::vector<int> open_at_op_;
};

// Installs the observer for one test and always uninstalls it.
class DispatchHookTest : public ::testing::Test {
 protected:
  void SetUp() override { SetObserver(&observer_); }
  void TearDown() override { SetObserver(nullptr); }
  KeepingObserver observer_;
};

TEST(DispatchHookKey, FirstCandidateWithoutAFallbackIsChosenOnce) {
  const bool taken_before = c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kHookKeyCandidates[0]);
  absl::StatusOr<c10::DispatchKey> key = InstallHook();
  ASSERT_TRUE(key.ok()) << key.status();
  if (!taken_before) {
    EXPECT_EQ(*key, kHookKeyCandidates[0]);
  }
  EXPECT_TRUE(c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(*key));
  EXPECT_EQ(*InstallHook(), *key) << "a second install must not move the hook";
  EXPECT_EQ(HookKey(), *key);
}

TEST(DispatchHookKey, ThreadLocalSwitch) {
  ASSERT_TRUE(SetHookEnabledOnThisThread(true).ok());
  EXPECT_TRUE(HookEnabledOnThisThread());
  {
    SuspendHook suspend;
    EXPECT_FALSE(HookEnabledOnThisThread());
  }
  EXPECT_TRUE(HookEnabledOnThisThread());
  ASSERT_TRUE(SetHookEnabledOnThisThread(false).ok());
  EXPECT_FALSE(HookEnabledOnThisThread());
  {
    ScopedHook hook;
    EXPECT_TRUE(HookEnabledOnThisThread());
  }
  EXPECT_FALSE(HookEnabledOnThisThread());
}

TEST(DispatchHookTraits, CollectivesAndProfilerOpsAreNotReplayable) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* name : {"c10d::allreduce_", "profiler::_record_function_enter_new"}) {
    std::optional<c10::OperatorHandle> op = dispatcher.findSchema({name, ""});
    if (!op) continue;  // a torch build without distributed or the profiler
    EXPECT_FALSE(TraitsOf(*op).replayable) << name;
    EXPECT_TRUE(TraitsOf(*op).tracked) << name;
  }
  EXPECT_TRUE(TraitsOf(dispatcher.findSchemaOrThrow("aten::relu", "")).replayable);
  EXPECT_TRUE(dispatcher.findSchema({"c10d::allreduce_", ""}).has_value()) << "expected in the 2.14 wheel";
}

TEST_F(DispatchHookTest, NothingIsRecordedWithoutTheKeyOrWithoutAnObserver) {
  at::Tensor x = at::ones({4});
  at::Tensor y = at::tanh(x);
  SetObserver(nullptr);
  {
    ScopedHook hook;
    y = at::mul(y, 2.0);  // pass-through
  }
  EXPECT_TRUE(observer_.Names().empty());
  EXPECT_FLOAT_EQ(y.const_data_ptr<float>()[0], 2.0f * std::tanh(1.0f));
}

TEST_F(DispatchHookTest, OnlyOutermostOpsAreRecordedWithInputsAndFreshOutputs) {
  at::Tensor a = at::ones({3, 3});
  at::Tensor b = at::ones({3, 3});
  at::Tensor c;
  {
    ScopedHook hook;
    c = at::add(a, b, 2);
  }
  // at::add allocates its output through at::empty inside the kernel: nested, not recorded.
  EXPECT_THAT(observer_.Names(), ElementsAre("aten::add.Tensor"));
  EXPECT_EQ(observer_.before(), 1);
  std::shared_ptr<OpRecord> add = observer_.Only("aten::add.Tensor");
  ASSERT_EQ(add->input_storages.size(), 2u);
  EXPECT_EQ(add->input_storages[0].get(), a.storage().unsafeGetStorageImpl());
  EXPECT_EQ(add->input_storages[1].get(), b.storage().unsafeGetStorageImpl());
  ASSERT_EQ(add->outputs.size(), 1u);
  EXPECT_EQ(add->outputs[0].input_storage, -1);
  EXPECT_EQ(add->outputs[0].storage.lock().get(), c.storage().unsafeGetStorageImpl());
  EXPECT_EQ(add->outputs[0].storage_nbytes, 9 * sizeof(float));
  EXPECT_THAT(add->outputs[0].meta.sizes, ElementsAre(3, 3));
  EXPECT_FALSE(add->traits->random);
  EXPECT_TRUE(add->traits->written_arguments.empty());
  // The captured arguments are detached aliases: same storage, no autograd history.
  ASSERT_EQ(add->arguments.size(), 3u);
  EXPECT_NE(add->arguments[0].toTensor().unsafeGetTensorImpl(), a.unsafeGetTensorImpl());
  EXPECT_TRUE(add->arguments[0].toTensor().is_alias_of(a));
  EXPECT_EQ(add->arguments[2].toScalar().toLong(), 2);
}

TEST_F(DispatchHookTest, InPlaceOpNamesTheMutatedArgumentAndAliasesIt) {
  at::Tensor x = at::ones({4});
  at::Tensor y = at::ones({4});
  {
    ScopedHook hook;
    x.add_(y);
  }
  std::shared_ptr<OpRecord> add_ = observer_.Only("aten::add_.Tensor");
  ASSERT_THAT(add_->traits->written_arguments, ElementsAre(0));
  EXPECT_THAT(add_->traits->out_argument, ElementsAre(false));
  EXPECT_EQ(add_->op.schema().arguments()[0].name(), "self");
  EXPECT_THAT(add_->traits->return_aliases, ElementsAre(0));
  EXPECT_FALSE(add_->traits->is_view);
  ASSERT_EQ(add_->outputs.size(), 1u);
  EXPECT_EQ(add_->outputs[0].input_storage, 0) << "the result is x's storage";
  EXPECT_FLOAT_EQ(x.const_data_ptr<float>()[0], 2.0f);
}

TEST_F(DispatchHookTest, TheCopyAutogradSavesOfAnInPlaceOpsInputReachesTheObserver) {
  const at::Tensor w = at::randn({4, 8}).set_requires_grad(true);
  const at::Tensor before = at::mul(w.detach(), 2.0);
  at::Tensor y;
  {
    ScopedHook hook;
    at::Tensor x = at::mul(w, 2.0);  // an intermediate: autograd's silu_ must save its value before the write
    y = at::silu_(x);
  }
  ASSERT_EQ(observer_.All("aten::silu_").size(), 1u);
  std::shared_ptr<OpRecord> silu_ = observer_.All("aten::silu_")[0];
  ASSERT_EQ(silu_->hidden_copies.size(), 1u);
  const OpRecord::HiddenCopy& hidden = silu_->hidden_copies[0];
  EXPECT_EQ(hidden.input_storage, 0);
  EXPECT_TRUE(hidden.whole_storage);
  const at::Tensor copy = at::empty({0}).set_(c10::Storage(hidden.copy), 0, {4, 8}, {8, 1});
  EXPECT_TRUE(SameBytes(copy, before)) << "the copy holds the value before the write";
  EXPECT_GT(hidden.copy.use_count(), 1u) << "autograd holds it";
  // The copy's clone was a call inside the op: not a record of its own.
  EXPECT_THAT(observer_.Names(), ElementsAre("aten::mul.Scalar", "aten::silu_"));
  // Without autograd recording the op, nothing is copied and nothing is watched.
  {
    at::NoGradGuard no_grad;
    ScopedHook hook;
    at::Tensor z = at::mul(w, 2.0);
    at::silu_(z);
  }
  EXPECT_THAT(observer_.Names(), ElementsAre("aten::mul.Scalar", "aten::silu_", "aten::mul.Scalar", "aten::silu_"));
  ASSERT_EQ(observer_.All("aten::silu_").size(), 2u);
  EXPECT_TRUE(observer_.All("aten::silu_")[1]->hidden_copies.empty());
  y.sum().backward();
  EXPECT_TRUE(w.grad().defined());
}

TEST_F(DispatchHookTest, OutVariantNamesTheOutArgument) {
  at::Tensor a = at::ones({4});
  at::Tensor out = at::empty({4});
  {
    ScopedHook hook;
    at::add_out(out, a, a);
  }
  std::shared_ptr<OpRecord> add_out = observer_.Only("aten::add.out");
  ASSERT_EQ(add_out->traits->written_arguments.size(), 1u);
  const int written = add_out->traits->written_arguments[0];
  EXPECT_EQ(add_out->op.schema().arguments()[written].name(), "out");
  EXPECT_THAT(add_out->traits->out_argument, ElementsAre(true));
  EXPECT_THAT(add_out->traits->return_aliases, ElementsAre(written));
  ASSERT_EQ(add_out->outputs.size(), 1u);
  ASSERT_GE(add_out->outputs[0].input_storage, 0);
  EXPECT_EQ(add_out->input_storages[add_out->outputs[0].input_storage].get(), out.storage().unsafeGetStorageImpl());
}

TEST_F(DispatchHookTest, ViewsShareTheStorageImpl) {
  at::Tensor x = at::ones({4, 6});
  at::Tensor t, parts;
  std::vector<at::Tensor> chunks;
  {
    ScopedHook hook;
    t = x.transpose(0, 1);
    chunks = x.split(2, 1);
  }
  EXPECT_EQ(t.storage().unsafeGetStorageImpl(), x.storage().unsafeGetStorageImpl());
  std::shared_ptr<OpRecord> transpose = observer_.Only("aten::transpose.int");
  EXPECT_TRUE(transpose->traits->is_view);
  EXPECT_THAT(transpose->traits->return_aliases, ElementsAre(0));
  ASSERT_EQ(transpose->outputs.size(), 1u);
  EXPECT_EQ(transpose->outputs[0].input_storage, 0);
  EXPECT_THAT(transpose->outputs[0].meta.strides, ElementsAre(1, 6));

  std::shared_ptr<OpRecord> split = observer_.Only("aten::split.Tensor");
  EXPECT_TRUE(split->traits->is_view) << "Tensor(a)[] return";
  ASSERT_EQ(split->outputs.size(), 3u);
  for (const CapturedOutput& out : split->outputs) {
    EXPECT_EQ(out.input_storage, 0);
    EXPECT_EQ(out.storage.lock().get(), x.storage().unsafeGetStorageImpl());
  }
  EXPECT_EQ(split->outputs[2].meta.storage_offset, 4);
}

TEST_F(DispatchHookTest, ReplayedDropoutReproducesItsMaskWithoutMovingTheRandomStream) {
  at::manual_seed(1234);
  at::Tensor x = at::randn({64, 64});
  at::Tensor y;
  {
    ScopedHook hook;
    y = at::dropout(x, 0.5, /*train=*/true);
  }
  // aten::dropout is a composite: the hook records what autograd sees, the mask drawn in place into a blank
  // buffer, scaled, then applied.
  EXPECT_THAT(observer_.Names(),
              ElementsAre("aten::empty_like", "aten::bernoulli_.float", "aten::div_.Scalar", "aten::mul.Tensor"));
  std::shared_ptr<OpRecord> bernoulli = observer_.Only("aten::bernoulli_.float");
  ASSERT_TRUE(bernoulli->traits->random);
  EXPECT_GE(bernoulli->traits->generator_argument, 0);
  ASSERT_TRUE(bernoulli->rng.has_value());
  ASSERT_TRUE(bernoulli->replayable);
  const at::Tensor mask = bernoulli->arguments[0].toTensor().clone();
  int zeros = 0;
  for (int i = 0; i < 64 * 64; ++i) zeros += mask.const_data_ptr<float>()[i] == 0.0f;
  EXPECT_GT(zeros, 64 * 64 * 0.4);
  EXPECT_LT(zeros, 64 * 64 * 0.6);

  const at::Tensor next_draw_reference = [] {
    at::Generator copy = at::detail::getDefaultCPUGenerator().clone();
    return at::rand({16}, copy);
  }();
  c10::Stack arguments = ReplayArguments(*bernoulli);
  const at::Tensor blank = at::zeros({64, 64});
  arguments[0] = blank;  // replayed into a fresh buffer, as the executor does
  absl::StatusOr<c10::Stack> replayed = ReplayWith(*bernoulli, std::move(arguments));
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  // The mask was scaled in place after it was drawn: replay the scaling too.
  c10::Stack scale = ReplayArguments(*observer_.Only("aten::div_.Scalar"));
  scale[0] = blank;
  ASSERT_TRUE(ReplayWith(*observer_.Only("aten::div_.Scalar"), std::move(scale)).ok());
  EXPECT_TRUE(SameBytes(blank, mask)) << "the replay drew a different mask";
  // The user's stream continues as if no replay happened.
  EXPECT_TRUE(SameBytes(at::rand({16}), next_draw_reference));
}

TEST_F(DispatchHookTest, CompositeOpsAreRecordedAsTheOpsTheyDecomposeInto) {
  at::Tensor x = at::randn({1, 2, 8, 8});
  at::Tensor w = at::randn({3, 2, 3, 3});
  {
    ScopedHook hook;
    (void)at::conv2d(x, w);
  }
  // aten::conv2d (CompositeImplicitAutograd) is not recorded; aten::convolution, which autograd records, is.
  EXPECT_THAT(observer_.Names(), ElementsAre("aten::convolution"));
}

TEST_F(DispatchHookTest, ACompositeOpsArgumentsAreHeldWhileItsNestedOpsRun) {
  // Its kernel may read them through raw pointers between the ops it calls (lstm's batch_sizes): the observer is
  // asked to hold them (each storage once) before the first nested op and let go after the last.
  at::Tensor x = at::randn({1, 2, 8, 8});
  at::Tensor w = at::randn({3, 2, 3, 3});
  const at::Tensor data = x.view({16, 8});
  const at::Tensor batch_sizes = at::mul(at::ones({2}, at::kLong), 8);
  {
    ScopedHook hook;
    (void)at::conv2d(x, w);
    (void)at::_pad_packed_sequence(data, batch_sizes, false, 0.0, 2);
  }
  const std::vector<KeepingObserver::Composite> composites = observer_.composites();
  ASSERT_GE(composites.size(), 2u);
  // Floating-point arguments are only passed on (kept in place if resident); integer ones may be read raw.
  EXPECT_THAT(composites[0].read_raw, ElementsAre());
  EXPECT_THAT(composites[0].passed_on,
              ElementsAre(x.storage().unsafeGetStorageImpl(), w.storage().unsafeGetStorageImpl()));
  EXPECT_THAT(composites[1].read_raw, ElementsAre(batch_sizes.storage().unsafeGetStorageImpl()));
  EXPECT_THAT(composites[1].passed_on, ElementsAre(data.storage().unsafeGetStorageImpl()));
  EXPECT_EQ(observer_.open_composites(), 0);
  const std::vector<int> open = observer_.open_composites_at_each_op();
  ASSERT_FALSE(open.empty());
  EXPECT_EQ(open[0], 1) << "aten::convolution ran with aten::conv2d's arguments held";
  EXPECT_TRUE(std::all_of(open.begin(), open.end(), [](int n) { return n >= 1; }));

  // An autocast wrapper only casts and calls the op again: it holds nothing itself, its two casts (aten::to, a
  // composite) do.
  at::Tensor a = at::randn({8, 8});
  const std::size_t before = observer_.composites().size();
  at::autocast::set_autocast_enabled(at::kCPU, true);
  {
    ScopedHook hook;
    (void)at::mm(a, a);
  }
  at::autocast::set_autocast_enabled(at::kCPU, false);
  const std::vector<KeepingObserver::Composite> casts = observer_.composites();
  ASSERT_EQ(casts.size(), before + 2);
  for (std::size_t i = before; i < casts.size(); ++i) {
    EXPECT_THAT(casts[i].passed_on, ElementsAre(a.storage().unsafeGetStorageImpl()));
  }
}

TEST_F(DispatchHookTest, ReplayWithAnExplicitGeneratorAndGeneratorlessOverload) {
  at::Generator generator = at::detail::createCPUGenerator(99);
  at::Tensor p = at::rand({256});
  at::Tensor mask, uniform;
  {
    ScopedHook hook;
    mask = at::bernoulli(p, generator);
    uniform = at::rand({32});  // aten::rand has no Generator argument in this overload: still random
  }
  std::shared_ptr<OpRecord> bernoulli = observer_.Only("aten::bernoulli");
  EXPECT_GE(bernoulli->traits->generator_argument, 0);
  (void)at::rand({8}, generator);  // move the user's generator on
  EXPECT_TRUE(SameBytes((*Replay(*bernoulli))[0].toTensor(), mask));

  std::shared_ptr<OpRecord> rand = observer_.Only("aten::rand");
  EXPECT_TRUE(rand->traits->random);
  EXPECT_EQ(rand->traits->generator_argument, -1);
  EXPECT_TRUE(SameBytes((*Replay(*rand))[0].toTensor(), uniform));
}

TEST_F(DispatchHookTest, BackwardOpsAreRecordedAndReplayRunsWithoutAutograd) {
  at::Tensor x = at::randn({8}).set_requires_grad(true);
  {
    ScopedHook hook;
    at::sum(at::tanh(x)).backward();
  }
  std::vector<std::string> names = observer_.Names();
  EXPECT_THAT(names, testing::Contains("aten::tanh_backward"));
  std::shared_ptr<OpRecord> tanh = observer_.Only("aten::tanh");
  absl::StatusOr<c10::Stack> replayed = Replay(*tanh);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  const at::Tensor again = (*replayed)[0].toTensor();
  EXPECT_FALSE(again.requires_grad());
  EXPECT_TRUE(SameBytes(again, at::tanh(x.detach())));
}

TEST_F(DispatchHookTest, AFailingOpIsReportedAndItsErrorPropagates) {
  at::Tensor a = at::ones({3});
  at::Tensor b = at::ones({4});
  {
    ScopedHook hook;
    EXPECT_THROW(at::add(a, b), c10::Error);
  }
  EXPECT_EQ(observer_.failed(), 1);
  EXPECT_TRUE(observer_.Names().empty());
}

// A dead record's aliases are reused by the next captures on the thread (RecycleAliases): the reused TensorImpl
// takes the new argument's storage and layout, holds no storage while it waits, and an alias anyone else still
// references is left alone.
TEST_F(DispatchHookTest, RecycledAliasesTakeTheNextArgumentAndHoldNothingMeanwhile) {
  at::Tensor a = at::randn({4, 4});
  const at::Tensor b = at::randn({3, 5}, at::kDouble).t();  // another dtype, transposed strides
  const at::Tensor b_view = b.slice(/*dim=*/0, /*start=*/1);  // a storage offset
  {
    ScopedHook hook;
    (void)at::tanh(a);
  }
  std::shared_ptr<OpRecord> first = observer_.Only("aten::tanh");
  ASSERT_EQ(first->arguments.size(), 1u);
  const c10::TensorImpl* recycled = first->arguments[0].toTensor().unsafeGetTensorImpl();
  const c10::weak_intrusive_ptr<c10::StorageImpl> a_storage = a.storage().getWeakStorageImpl();
  first->input_storages.clear();
  RecycleAliases(first->arguments);
  EXPECT_TRUE(first->arguments.empty());
  a.reset();
  EXPECT_TRUE(a_storage.expired()) << "a recycled alias must not keep its old storage alive";

  {
    ScopedHook hook;
    (void)at::sin(b_view);
  }
  std::shared_ptr<OpRecord> second = observer_.Only("aten::sin");
  const at::Tensor& alias = second->arguments[0].toTensor();
  EXPECT_EQ(alias.unsafeGetTensorImpl(), recycled) << "the spare was not reused";
  EXPECT_EQ(alias.storage().unsafeGetStorageImpl(), b_view.storage().unsafeGetStorageImpl());
  EXPECT_EQ(alias.sizes(), b_view.sizes());
  EXPECT_EQ(alias.strides(), b_view.strides());
  EXPECT_EQ(alias.storage_offset(), b_view.storage_offset());
  EXPECT_EQ(alias.scalar_type(), at::kDouble);
  EXPECT_EQ(alias.is_contiguous(), b_view.is_contiguous());
  EXPECT_FALSE(alias.unsafeGetTensorImpl()->version_counter().enabled());
  absl::StatusOr<c10::Stack> replayed = Replay(*second);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(SameBytes((*replayed)[0].toTensor(), at::sin(b_view)));

  // Held elsewhere: not taken.
  const at::Tensor held = alias;
  RecycleAliases(second->arguments);
  EXPECT_TRUE(held.has_storage());
  EXPECT_EQ(held.storage().unsafeGetStorageImpl(), b_view.storage().unsafeGetStorageImpl());
  EXPECT_EQ(held.sizes(), b_view.sizes());
}

// ---- Threads a recorded kernel starts ----

// A kernel that does its work on other threads, as real kernels do: two at::parallel_for chunks (OpenMP workers)
// and one at::launch task (the inter-op pool, which carries the launching thread's dispatch key state), each
// running dispatcher ops. Everything it runs is part of the op: its replay runs it all again.
at::Tensor ThreadedAddKernel(const at::Tensor& a, const at::Tensor& b) {
  std::vector<at::Tensor> parts(2);
  at::parallel_for(0, 2, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) parts[static_cast<std::size_t>(i)] = at::add(a, b);
  });
  std::promise<at::Tensor> launched;
  std::future<at::Tensor> product = launched.get_future();
  at::launch([&] { launched.set_value(at::mul(a, b)); });
  return at::add(at::add(parts[0], parts[1]), product.get());
}

TORCH_LIBRARY_FRAGMENT(remat_hook_test, m) { m.def("threaded_add(Tensor a, Tensor b) -> Tensor"); }
TORCH_LIBRARY_IMPL(remat_hook_test, CPU, m) { m.impl("threaded_add", &ThreadedAddKernel); }

at::Tensor ThreadedAdd(const at::Tensor& a, const at::Tensor& b) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("remat_hook_test::threaded_add", "");
  return op.typed<at::Tensor(const at::Tensor&, const at::Tensor&)>().call(a, b);
}

// The kernel runs with the hook's key excluded (dispatch_hook.cc, RecordOp): the ops of the threads it starts are
// not recorded as ops of their own, whether the thread inherits the key state (at::launch) or not (OpenMP), and the
// key is back once the op returns, also when it threw.
TEST_F(DispatchHookTest, KernelThreadsOpsArePartOfTheOp) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const at::Tensor a = at::randn({4, 4});
  const at::Tensor b = at::randn({4, 4});
  const at::Tensor mismatched = at::ones({3});
  at::Tensor out;
  {
    ScopedHook hook;
    out = ThreadedAdd(a, b);
    EXPECT_TRUE(HookEnabledOnThisThread());
    EXPECT_THROW(ThreadedAdd(a, mismatched), c10::Error);
    EXPECT_TRUE(HookEnabledOnThisThread());
  }
  at::set_num_threads(threads);
  EXPECT_THAT(observer_.Names(), ElementsAre("remat_hook_test::threaded_add"));
  EXPECT_EQ(observer_.failed(), 1);
  absl::StatusOr<c10::Stack> replayed = Replay(*observer_.Only("remat_hook_test::threaded_add"));
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(SameBytes((*replayed)[0].toTensor(), out));
}

// A backward pass a recorded kernel runs is part of it too (on CPU autograd runs it on the calling thread, with the
// key state captured from it); backward passes started outside any op are recorded op by op.
at::Tensor GradKernel(const at::Tensor& a) {
  // The op has no autograd kernel: torch's fallback ran it below autograd. Autograd back on, the rest as it is.
  c10::impl::LocalDispatchKeySet state = c10::impl::tls_local_dispatch_key_set();
  state.excluded_ = state.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  const c10::impl::ForceDispatchKeyGuard autograd_on(state);
  at::AutoGradMode grad(true);
  at::Tensor leaf = a.detach().set_requires_grad(true);
  at::sum(at::tanh(leaf)).backward();
  return leaf.grad();
}

TORCH_LIBRARY_FRAGMENT(remat_hook_test, m) { m.def("grad_of_tanh(Tensor a) -> Tensor"); }
TORCH_LIBRARY_IMPL(remat_hook_test, CompositeExplicitAutograd, m) { m.impl("grad_of_tanh", &GradKernel); }

TEST_F(DispatchHookTest, ABackwardPassInsideAKernelIsPartOfItAndOneOutsideIsRecorded) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("remat_hook_test::grad_of_tanh", "");
  const at::Tensor a = at::randn({8});
  at::Tensor x = at::randn({8}).set_requires_grad(true);
  {
    ScopedHook hook;
    (void)op.typed<at::Tensor(const at::Tensor&)>().call(a);
    at::sum(at::tanh(x)).backward();
  }
  const std::vector<std::string> names = observer_.Names();
  EXPECT_EQ(names.front(), "remat_hook_test::grad_of_tanh");
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::tanh"), 1) << testing::PrintToString(names);
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::tanh_backward"), 1) << testing::PrintToString(names);
}

TEST_F(DispatchHookTest, MultiOutputOpRestoresEveryEvictedOutput) {
  at::Tensor x = at::randn({16, 8});
  std::tuple<at::Tensor, at::Tensor> result;
  {
    ScopedHook hook;
    result = at::max(x, 1);
  }
  const at::Tensor values = std::get<0>(result);
  const at::Tensor indices = std::get<1>(result);
  const at::Tensor values_copy = values.clone();
  const at::Tensor indices_copy = indices.clone();
  std::shared_ptr<OpRecord> max = observer_.Only("aten::max.dim");
  ASSERT_EQ(max->outputs.size(), 2u);
  EXPECT_EQ(max->outputs[1].return_index, 1);
  EXPECT_EQ(max->outputs[1].meta.dtype, at::kLong);
  ASSERT_TRUE(EvictStorage(*values.storage().unsafeGetStorageImpl()).ok());
  ASSERT_TRUE(EvictStorage(*indices.storage().unsafeGetStorageImpl()).ok());
  absl::StatusOr<c10::Stack> replayed = Replay(*max);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  absl::StatusOr<int> restored = RestoreOutputs(*max, *replayed);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 2);
  EXPECT_TRUE(SameBytes(values, values_copy));
  EXPECT_TRUE(SameBytes(indices, indices_copy));
  EXPECT_EQ(*RestoreOutputs(*max, *Replay(*max)), 0) << "nothing is evicted any more";
}

TEST_F(DispatchHookTest, InPlaceReplayOnSubstitutedArguments) {
  at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f});
  {
    ScopedHook hook;
    x.mul_(2.0);
  }
  std::shared_ptr<OpRecord> mul_ = observer_.Only("aten::mul_.Scalar");
  ASSERT_THAT(mul_->traits->written_arguments, ElementsAre(0));
  // The runtime rematerializes the old value of the written argument elsewhere and replays on it.
  c10::Stack arguments = ReplayArguments(*mul_);
  at::Tensor old_value = at::tensor({1.0f, 2.0f, 3.0f});
  arguments[0] = old_value;
  absl::StatusOr<c10::Stack> replayed = ReplayWith(*mul_, std::move(arguments));
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(SameBytes(old_value, x));
  EXPECT_TRUE((*replayed)[0].toTensor().is_alias_of(old_value));
  EXPECT_FLOAT_EQ(x.const_data_ptr<float>()[2], 6.0f) << "replaying on a substitute leaves x alone";
  EXPECT_EQ(ReplayWith(*mul_, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DispatchHookTest, ReplayUsesTheAutocastStateOfTheCapture) {
  at::Tensor a = at::randn({8, 8});
  at::Tensor b = at::randn({8, 8});
  const at::ScalarType default_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  at::Tensor product;
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  {
    ScopedHook hook;
    product = at::mm(a, b);
  }
  at::autocast::set_autocast_dtype(at::kCPU, default_dtype);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  ASSERT_EQ(product.scalar_type(), at::kBFloat16) << "autocast ran below the hook";
  // The autocast wrapper of aten::mm casts through the dispatcher and calls aten::mm again with autocast excluded:
  // the hook records the casts and that inner mm (on bfloat16 inputs), so the casts are evictable too.
  EXPECT_THAT(observer_.Names(), ElementsAre("aten::_to_copy", "aten::_to_copy", "aten::mm"));
  std::shared_ptr<OpRecord> mm = observer_.Only("aten::mm");
  EXPECT_EQ(mm->arguments[0].toTensor().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(mm->tls_keys.excluded_.has(c10::DispatchKey::AutocastCPU));

  // Replayed with autocast off: the capture's state comes back for the replay.
  absl::StatusOr<c10::Stack> replayed = Replay(*mm);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(SameBytes((*replayed)[0].toTensor(), product));
  // Replayed under another autocast dtype: still the capture's.
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kHalf);
  replayed = Replay(*mm);
  at::autocast::set_autocast_dtype(at::kCPU, default_dtype);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(SameBytes((*replayed)[0].toTensor(), product));
  EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), default_dtype) << "the replay restored the thread's dtype";
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat) << "the replay restored the thread's key state";
}

TEST_F(DispatchHookTest, NonStridedArgumentsMakeARecordNotReplayable) {
  at::Tensor sparse = at::ones({2, 2}).to_sparse();
  {
    ScopedHook hook;
    (void)at::add(sparse, sparse);
  }
  std::shared_ptr<OpRecord> add = observer_.Only("aten::add.Tensor");
  EXPECT_FALSE(add->replayable);
  EXPECT_TRUE(add->outputs.empty()) << "a sparse result has no storage remat could evict";
  EXPECT_EQ(Replay(*add).status().code(), absl::StatusCode::kFailedPrecondition);
}


// ---- Coverage: an op is recorded unless the kernel the dispatcher takes for it is its composite one ----

// The line of c10's computed dispatch table for `key` ("AutogradCPU: registered at ... [autograd kernel]").
std::string ComputedTableLine(const c10::OperatorHandle& op, c10::DispatchKey key) {
  const std::string table = op.dumpComputedTable();
  const std::string prefix = c10::toString(key) + std::string(": ");
  for (std::size_t start = 0; start < table.size();) {
    std::size_t end = table.find('\n', start);
    if (end == std::string::npos) end = table.size();
    std::string line = table.substr(start, end - start);
    if (line.rfind(prefix, 0) == 0) return line;
    start = end + 1;
  }
  return {};
}

TEST(DispatchHookCoverage, TheCompositeKernelChoiceAgreesWithTheDispatchersOwnTableForEveryOp) {
  auto& dispatcher = c10::Dispatcher::singleton();
  int ops = 0, composite = 0;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    ++ops;
    for (c10::DispatchKey key : {c10::DispatchKey::CPU, c10::DispatchKey::AutogradCPU, c10::DispatchKey::Meta}) {
      const std::string line = ComputedTableLine(*op, key);
      const bool table_says = line.find("[math kernel]") != std::string::npos ||
                              line.find("[nested kernel]") != std::string::npos;
      EXPECT_EQ(TakesCompositeKernel(*op, key), table_says) << name.name << "." << name.overload_name << " at "
                                                             << c10::toString(key) << ": " << line;
      composite += table_says;
    }
  }
  EXPECT_GT(ops, 2000);
  EXPECT_GT(composite, 300);  // linear, conv2d, dropout, matmul, ...: the composites the hook lets decompose
}

// Arguments for every aten op that has both a CompositeImplicitAutograd kernel and a CPU kernel (on CPU the CPU one
// runs: the op must be recorded, or it would read evicted inputs unseen). A torch that adds one to the class fails
// the test below until it is added here.
struct CompositeWithCpuKernel {
  const char* name;
  std::function<void(const at::Tensor& a, const at::Tensor& b)> call;
};

std::vector<CompositeWithCpuKernel> CompositeOpsWithACpuKernel() {
  return {
      {"aten::silu_backward", [](const at::Tensor& g, const at::Tensor& x) { (void)at::silu_backward(g, x); }},
      {"aten::mish_backward", [](const at::Tensor& g, const at::Tensor& x) { (void)at::mish_backward(g, x); }},
      {"aten::native_channel_shuffle",
       [](const at::Tensor&, const at::Tensor& x) { (void)at::native_channel_shuffle(x.view({1, 4, 4, 4}), 2); }},
  };
}

TEST_F(DispatchHookTest, EveryOpWithACompositeAndACpuKernelIsRecordedOnCpu) {
  auto& dispatcher = c10::Dispatcher::singleton();
  std::vector<std::string> in_class;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || name.name.rfind("aten::", 0) != 0) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
        op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
      in_class.push_back(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
    }
  }
  const std::vector<CompositeWithCpuKernel> known = CompositeOpsWithACpuKernel();
  std::vector<std::string> known_names;
  for (const auto& k : known) known_names.push_back(k.name);
  EXPECT_THAT(in_class, ::testing::UnorderedElementsAreArray(known_names))
      << "an op gained or lost both a composite and a CPU kernel: give it arguments in CompositeOpsWithACpuKernel";
  const at::Tensor g = at::randn({64});
  for (const bool requires_grad : {false, true}) {  // the top key below the hook: CPU, then AutogradCPU
    const at::Tensor x = at::randn({64}).set_requires_grad(requires_grad);
    for (const auto& op : known) {
      KeepingObserver fresh;
      SetObserver(&fresh);
      {
        ScopedHook hook;
        op.call(g, x);
      }
      SetObserver(&observer_);
      EXPECT_THAT(fresh.Names(), ::testing::Contains(op.name)) << "with requires_grad " << requires_grad;
    }
  }
}

TEST_F(DispatchHookTest, AnUnrecordedReadOfAnEvictedStorageNamesTheOp) {
  // aten::linear decomposes (its parts are recorded); make it read an evicted weight through its parts' kernels
  // with the observer off for them: the error names the innermost op the hook let through.
  const at::Tensor x = at::randn({4, 8});
  at::Tensor w = at::randn({8, 8});
  ASSERT_TRUE(EvictStorage(*w.storage().unsafeGetStorageImpl()).ok());
  SetObserver(nullptr);
  ScopedHook hook;
  try {
    (void)at::mm(x, w);
    FAIL() << "reading an evicted storage must throw";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_THAT(what, ::testing::HasSubstr(kEvictedAccessMessage));
    EXPECT_THAT(what, ::testing::HasSubstr(std::string(kUnrecordedReadContext) + " aten::mm"));
  }
}

// ---- Side effects: writes the schema does not declare ----

TEST(DispatchHookEffects, TheUnannotatedWritesTableMatchesTheRegisteredSchemas) {
  auto& dispatcher = c10::Dispatcher::singleton();
  int checked = 0;
  for (const UnannotatedWrite& entry : UnannotatedWrites()) {
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name != entry.op) continue;
      const c10::FunctionSchema& schema = dispatcher.findOp(name)->schema();
      for (const int a : entry.arguments) {
        ASSERT_LT(a, static_cast<int>(schema.arguments().size())) << schema;
        EXPECT_THAT(schema.arguments()[a].name(), ::testing::StartsWith("running_")) << schema;
        EXPECT_EQ(schema.arguments()[a].alias_info(), nullptr) << "declared now: drop it from the table: " << schema;
      }
      ASSERT_LT(entry.when_true, static_cast<int>(schema.arguments().size())) << schema;
      EXPECT_EQ(schema.arguments()[entry.when_true].name(), "training") << schema;
      ++checked;
    }
  }
  EXPECT_GE(checked, 6);  // three ops, each with its .out overload
}

TEST_F(DispatchHookTest, BatchNormInTrainingModeWritesItsRunningStatisticsAndReplaysNeverDo) {
  const at::Tensor x = at::randn({4, 3, 5, 5});
  at::Tensor mean = at::zeros({3});
  at::Tensor var = at::ones({3});
  std::tuple<at::Tensor, at::Tensor, at::Tensor> out;
  {
    ScopedHook hook;
    out = at::native_batch_norm(x, {}, {}, mean, var, /*training=*/true, 0.1, 1e-5);
  }
  std::shared_ptr<OpRecord> record = observer_.Only("aten::native_batch_norm");
  EXPECT_THAT(record->unannotated_writes, ElementsAre(3, 4));
  const at::Tensor mean_after = mean.clone();
  // A replay on the recorded arguments would apply the momentum update again: the runtime replays on copies of the
  // written arguments (torch_executor.h); this checks the table is what tells it which those are.
  EXPECT_TRUE(SameBytes(mean, mean_after));
  KeepingObserver eval;  // in eval mode it reads them, writes nothing on the side
  SetObserver(&eval);
  {
    ScopedHook hook;
    (void)at::native_batch_norm(x, {}, {}, mean, var, /*training=*/false, 0.1, 1e-5);
  }
  SetObserver(&observer_);
  EXPECT_TRUE(eval.Only("aten::native_batch_norm")->unannotated_writes.empty());
}


// A replay of an op that writes arguments it does not return gets fresh memory in their place (torch_executor.h),
// which is right only when its outputs ignore their values: batch norm in training mode, rrelu. QAT's fused
// observer quantizes with the scale it has just written: replayed that way it would compute other bytes.
TEST_F(DispatchHookTest, OnlyCallsWhoseOutputsIgnoreWhatTheyWriteOnTheSideAreReplayable) {
  const at::Tensor x = at::randn({8, 3});
  at::Tensor running_min = at::full({1}, 0.0);
  at::Tensor running_max = at::full({1}, 0.0);
  at::Tensor scale = at::ones({1});
  at::Tensor zero_point = at::zeros({1}, at::kInt);
  at::Tensor mean = at::zeros({3});
  at::Tensor var = at::ones({3});
  const at::Tensor on = at::ones({1}, at::kLong);
  at::Tensor noise = at::empty_like(x);
  {
    ScopedHook hook;
    (void)at::fused_moving_avg_obs_fake_quant(x, on, on, running_min, running_max, scale, zero_point, 0.01, 0, 255,
                                              -1);
    (void)at::_native_batch_norm_legit(x, {}, {}, mean, var, /*training=*/true, 0.1, 1e-5);
    (void)at::_native_batch_norm_legit(x, {}, {}, mean, var, /*training=*/false, 0.1, 1e-5);
    (void)at::rrelu_with_noise(x, noise, 0.1, 0.3, /*training=*/true);
  }
  int fake_quants = 0;
  for (const std::string& name : observer_.Names()) {
    if (name.find("fused_moving_avg_obs_f") == std::string::npos) continue;
    ++fake_quants;
    for (const auto& record : observer_.All(name)) {
      EXPECT_FALSE(record->replayable) << name << ": its output depends on the scale it writes";
    }
  }
  EXPECT_GE(fake_quants, 1);
  std::vector<bool> legit;
  for (const auto& record : observer_.All("aten::_native_batch_norm_legit")) legit.push_back(record->replayable);
  EXPECT_THAT(legit, ElementsAre(true, false)) << "training mode ignores the running statistics, eval reads them";
  EXPECT_TRUE(observer_.Only("aten::rrelu_with_noise")->replayable);
}

}  // namespace
}  // namespace remat::integration
