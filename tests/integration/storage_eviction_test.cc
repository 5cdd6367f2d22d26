// Storage eviction: evict/restore on a bare StorageImpl, and DESIGN.md's probe end to end: a relu output that
// autograd saved is evicted after the forward pass and restored inside the dispatch hook before the backward op
// reads it, by replaying the recorded relu; gradients are bitwise identical to a run without eviction.
#include "integration/storage_eviction.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "integration/dispatch_hook.h"
#include "integration/same_bytes.h"

namespace remat::integration {
namespace {

c10::StorageImpl& StorageOf(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

TEST(StorageEviction, EvictFreesAndMarksRestoreMovesMemoryIn) {
  at::Tensor x = at::arange(16, at::kFloat);
  at::Tensor view = x.view({4, 4}).t();  // shares the StorageImpl
  const at::Tensor expected = x.clone();
  c10::StorageImpl& storage = StorageOf(x);

  absl::StatusOr<std::size_t> nbytes = EvictStorage(storage);
  ASSERT_TRUE(nbytes.ok()) << nbytes.status();
  EXPECT_EQ(*nbytes, 16 * sizeof(float));
  EXPECT_TRUE(IsEvicted(storage));
  EXPECT_EQ(storage.nbytes(), 0u);
  EXPECT_EQ(storage._mutable_data_ptr_no_checks().get(), nullptr);
  EXPECT_EQ(storage.device(), c10::Device(c10::kCPU));
  // Reading through the tensor or its view throws a clear error instead of touching freed memory.
  EXPECT_THAT([&] { (void)x.const_data_ptr(); }, testing::ThrowsMessage<c10::Error>(testing::HasSubstr("evicted")));
  EXPECT_THROW((void)view.mutable_data_ptr(), c10::Error);
  EXPECT_EQ(EvictStorage(storage).status().code(), absl::StatusCode::kFailedPrecondition);

  at::Tensor recomputed = at::arange(16, at::kFloat);
  const void* memory = recomputed.const_data_ptr();
  ASSERT_TRUE(RestoreStorage(storage, *nbytes, StorageOf(recomputed)).ok());
  EXPECT_FALSE(IsEvicted(storage));
  EXPECT_EQ(storage.nbytes(), *nbytes);
  EXPECT_EQ(x.const_data_ptr(), memory) << "the memory is moved, not copied";
  EXPECT_EQ(StorageOf(recomputed).nbytes(), 0u);
  EXPECT_TRUE(SameBytes(x, expected));
  EXPECT_TRUE(SameBytes(view, expected.view({4, 4}).t()));
}

TEST(StorageEviction, RejectsWhatItCannotDo) {
  at::Tensor x = at::zeros({8});
  at::Tensor empty = at::zeros({0});
  EXPECT_EQ(EvictStorage(StorageOf(empty)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RestoreStorage(StorageOf(x), 32, StorageOf(empty)).code(), absl::StatusCode::kFailedPrecondition)
      << "restoring a storage that is not evicted";
  const std::size_t nbytes = *EvictStorage(StorageOf(x));
  at::Tensor wrong_size = at::zeros({4});
  EXPECT_EQ(RestoreStorage(StorageOf(x), nbytes, StorageOf(wrong_size)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RestoreStorage(StorageOf(x), nbytes, StorageOf(x)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsEvicted(StorageOf(x)));
  EXPECT_EQ(wrong_size.const_data_ptr<float>()[0], 0.0f) << "a failed restore leaves the source alone";
}

// Keeps every record and, before an op runs, restores its evicted inputs by replaying their producers.
class RestoringObserver : public OpObserver {
 public:
  void BeforeOp(OpRecord& record) override {
    for (const auto& input : record.input_storages) {
      if (!IsEvicted(*input)) continue;
      std::shared_ptr<OpRecord> producer = ProducerOf(input.get());
      ASSERT_NE(producer, nullptr) << "no record produced an evicted input of " << record.traits->name;
      absl::StatusOr<c10::Stack> replayed = Replay(*producer);
      ASSERT_TRUE(replayed.ok()) << replayed.status();
      absl::StatusOr<int> restored = RestoreOutputs(*producer, *replayed);
      ASSERT_TRUE(restored.ok()) << restored.status();
      std::lock_guard<std::mutex> lock(mutex_);
      restores_.push_back(producer->traits->name + " for " + record.traits->name);
    }
  }
  void AfterOp(OpRecord&& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.push_back(std::make_shared<OpRecord>(std::move(record)));
  }
  void OpFailed(OpRecord&) noexcept override {}

  std::shared_ptr<OpRecord> Find(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& r : records_) {
      if (r->traits->name == name) return r;
    }
    return nullptr;
  }
  std::vector<std::string> restores() {
    std::lock_guard<std::mutex> lock(mutex_);
    return restores_;
  }

 private:
  std::shared_ptr<OpRecord> ProducerOf(const c10::StorageImpl* storage) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& r : records_) {
      for (const CapturedOutput& out : r->outputs) {
        if (out.input_storage < 0 && out.storage.lock().get() == storage) return r;
      }
    }
    return nullptr;
  }

  std::mutex mutex_;
  std::vector<std::shared_ptr<OpRecord>> records_;
  std::vector<std::string> restores_;
};

struct Grads {
  at::Tensor x, w;
};

Grads RunProbe(bool evict, RestoringObserver* observer) {
  at::Tensor x = at::randn({16, 32}).set_requires_grad(true);
  at::Tensor w = at::randn({32, 8}).set_requires_grad(true);
  ScopedHook hook;
  at::Tensor loss = at::sum(at::relu(at::mm(x, w)));
  if (evict) {
    std::shared_ptr<OpRecord> relu = observer->Find("aten::relu");
    EXPECT_NE(relu, nullptr);
    if (relu == nullptr) return {};
    EXPECT_EQ(relu->outputs.size(), 1u);
    c10::intrusive_ptr<c10::StorageImpl> saved = relu->outputs.at(0).storage.lock();
    EXPECT_TRUE(saved) << "autograd saved relu's result for threshold_backward: the storage must be alive";
    EXPECT_TRUE(EvictStorage(*saved).ok());
  }
  loss.backward();
  return {x.grad(), w.grad()};
}

TEST(StorageEviction, EvictedSavedTensorIsRestoredBeforeBackwardWithBitwiseIdenticalGradients) {
  RestoringObserver observer;
  SetObserver(&observer);
  at::manual_seed(7);
  const Grads reference = RunProbe(/*evict=*/false, &observer);
  RestoringObserver evicting;
  SetObserver(&evicting);
  at::manual_seed(7);
  const Grads evicted = RunProbe(/*evict=*/true, &evicting);
  SetObserver(nullptr);

  EXPECT_THAT(evicting.restores(), testing::ElementsAre("aten::relu for aten::threshold_backward"));
  ASSERT_TRUE(evicted.x.defined() && evicted.w.defined());
  EXPECT_TRUE(SameBytes(evicted.x, reference.x));
  EXPECT_TRUE(SameBytes(evicted.w, reference.w));
}

}  // namespace
}  // namespace remat::integration
