// Engines on several devices in one process (issue 19, "Every device"; integration/device_router.h), on the CUDA
// runtime's test double with real CPU kernels on its device memory (tests/cuda/fake_device.h: a tensor is on the device
// whose arena its bytes come from, the double's current device when it was made). Each device has its own engine,
// arena and budget; ops go to the engine of their tensors' device and run with that device current; a copy between
// devices is read by the source's engine and kept (or paged) by the destination's. Results are compared byte for byte
// with runs on plain host memory.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "integration/device_router.h"
#include "integration/dispatch_hook.h"
#include "integration/engine_session.h"
#include "integration/same_bytes.h"
#include "integration/session.h"
#include "integration/storage_eviction.h"
#include "tests/cuda/fake_device.h"
#include "tests/integration/chain_workload.h"

namespace remat::integration {
namespace {

constexpr std::size_t kKiB = 1024;

at::Tensor Input(int seed) {
  at::manual_seed(seed);
  return at::randn({128, 128});  // 64 KiB
}

// Chain(x, n) with the random stream at `chain_seed`.
std::vector<at::Tensor> ChainFrom(const at::Tensor& x, int chain_seed, int n) {
  at::manual_seed(chain_seed);
  return Chain(x, n);
}

bool Evicted(const at::Tensor& t) { return IsEvicted(*t.storage().unsafeGetStorageImpl()); }

// Two devices, each with its own engine and budget (device 1's smaller), a chain on each under three times its budget.
// The chain on device 1 runs while the thread's current device is 0: its ops go to device 1's engine because their
// tensors are there, and their outputs land in device 1's arena because the router makes it current for them.
TEST(CudaEngineDevices, ChainsOnTwoDevicesEachUnderItsOwnBudgetAreBitwiseIdentical) {
  const std::vector<at::Tensor> reference0 = ChainFrom(Input(11), 7, 24);  // plain host memory
  const std::vector<at::Tensor> reference1 = ChainFrom(Input(12), 8, 20);
  FakeDevice device(704 * kKiB, /*devices=*/2);
  ASSERT_TRUE(device.SetBudget(1, 576 * kKiB).ok());
  device.Use(1);
  const at::Tensor x1 = Input(12);
  device.Use(0);
  const at::Tensor x0 = Input(11);
  ASSERT_EQ(device.Stats(1).allocated_bytes.current, 64 * static_cast<std::int64_t>(kKiB));
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 0).ok());
  const absl::Status second = device.Enable("dtr-eq", OffloadMode::kOff, 1);
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(RematEngineDevices(), (std::vector<int>{0, 1}));
  EXPECT_EQ(device.Enable("lru", OffloadMode::kOff, 1).code(), absl::StatusCode::kAlreadyExists);
  std::vector<at::Tensor> ys0 = ChainFrom(x0, 7, 24);
  std::vector<at::Tensor> ys1 = ChainFrom(x1, 8, 20);  // current device 0 all along
  EXPECT_EQ(*device.rt.GetDevice(), 0);                // given back after each op
  // Each op went to one engine: the two counts add up to what the session saw, each at least its chain's 3 per step.
  const std::int64_t ops0 = GetEngineStats(0)->ops;
  const std::int64_t ops1 = GetEngineStats(1)->ops;
  EXPECT_EQ(static_cast<std::uint64_t>(ops0 + ops1), GetRematStats().ops_recorded);
  EXPECT_GE(ops0, 3 * 24);
  EXPECT_GE(ops1, 3 * 20);
  for (std::size_t i = 0; i < ys0.size(); ++i) EXPECT_TRUE(SameBytes(ys0[i], reference0[i])) << "device 0, " << i;
  for (std::size_t i = 0; i < ys1.size(); ++i) EXPECT_TRUE(SameBytes(ys1[i], reference1[i])) << "device 1, " << i;
  for (int d : {0, 1}) {
    absl::StatusOr<BridgeStats> stats = GetEngineStats(d);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->engine.evictions, 0) << d;
    EXPECT_GT(stats->engine.rematerializations, 0) << d;
    const cuda::DeviceArenaStats arena = device.Stats(d);
    EXPECT_LE(arena.allocated_bytes.peak, static_cast<std::int64_t>(device.budget(d))) << d;
    EXPECT_GT(arena.pressure_allocations, 0) << d;
  }
  EXPECT_LT(device.budget(1), device.budget(0));
  EXPECT_EQ(GetEngineStats().status().code(), absl::StatusCode::kFailedPrecondition);  // ask per device
  // Disabling brings back what is still held on each device, under each budget.
  const std::vector<at::Tensor> kept0 = {ys0[0], ys0[11], ys0[23]};
  const std::vector<at::Tensor> kept1 = {ys1[1], ys1[19]};
  ys0.clear();
  ys1.clear();
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
  EXPECT_TRUE(RematEngineDevices().empty());
  EXPECT_TRUE(SameBytes(kept0[0], reference0[0]) && SameBytes(kept0[1], reference0[11]) &&
              SameBytes(kept0[2], reference0[23]));
  EXPECT_TRUE(SameBytes(kept1[0], reference1[1]) && SameBytes(kept1[1], reference1[19]));
  EXPECT_TRUE(GetEngineStats(1).ok());  // the last session's, per device
}

// Copies between devices under pressure on both: device 0's evicted values are brought back by its engine to be read
// by the copy; the copies are kept by device 1's engine (a replay there could not bring device 0's inputs back) while
// a chain from them evicts its own values; and a copy back to device 0 reads device 1's values the same way.
TEST(CudaEngineDevices, CopiesBetweenDevicesUnderPressureStayIdentical) {
  const std::vector<at::Tensor> reference0 = ChainFrom(Input(11), 7, 24);
  const std::vector<int> copied = {3, 9, 15, 21};
  const std::vector<at::Tensor> reference1 = ChainFrom(reference0[21], 9, 12);
  FakeDevice device(704 * kKiB, /*devices=*/2);
  ASSERT_TRUE(device.SetBudget(1, 640 * kKiB).ok());
  const at::Tensor x0 = Input(11);
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 0).ok());
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 1).ok());
  std::vector<at::Tensor> ys0 = ChainFrom(x0, 7, 24);
  std::vector<at::Tensor> copies;
  int evicted_sources = 0;
  for (const int i : copied) {
    device.Use(1);
    at::Tensor copy = at::empty({128, 128});  // on device 1
    device.Use(0);
    evicted_sources += Evicted(ys0[static_cast<std::size_t>(i)]);
    copy.copy_(ys0[static_cast<std::size_t>(i)]);
    copies.push_back(copy);
  }
  EXPECT_GT(evicted_sources, 0);  // some copies read values device 0's engine had to bring back
  for (std::size_t j = 0; j < copies.size(); ++j) {
    EXPECT_TRUE(SameBytes(copies[j], reference0[static_cast<std::size_t>(copied[j])])) << j;
  }
  std::vector<at::Tensor> ys1 = ChainFrom(copies.back(), 9, 12);  // on device 1, under its budget
  for (std::size_t i = 0; i < ys1.size(); ++i) EXPECT_TRUE(SameBytes(ys1[i], reference1[i])) << i;
  absl::StatusOr<BridgeStats> stats1 = GetEngineStats(1);
  ASSERT_TRUE(stats1.ok());
  EXPECT_GT(stats1->engine.evictions, 0);
  for (const at::Tensor& copy : copies) EXPECT_FALSE(Evicted(copy));  // kept: never dropped
  // And back: device 0's engine records the copy into its storage, device 1's brings its value back to be read.
  int evicted_back = 0;
  std::vector<at::Tensor> backs;
  for (const std::size_t i : {std::size_t{1}, std::size_t{4}, std::size_t{7}}) {
    at::Tensor back = at::empty({128, 128});  // current device 0
    evicted_back += Evicted(ys1[i]);
    back.copy_(ys1[i]);
    backs.push_back(back);
    EXPECT_TRUE(SameBytes(back, reference1[i])) << i;
  }
  EXPECT_GT(evicted_back, 0);
  EXPECT_TRUE(SameBytes(at::sin(backs[0]), at::sin(reference1[1])));  // usable on device 0 as any value
  for (int d : {0, 1}) {
    EXPECT_LE(device.Stats(d).allocated_bytes.peak, static_cast<std::int64_t>(device.budget(d))) << d;
  }
  for (std::size_t i = 0; i < ys0.size(); ++i) EXPECT_TRUE(SameBytes(ys0[i], reference0[i])) << i;
  ys0.resize(2);
  ys1.resize(2);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

// The destination keeps what it cannot recompute: copies beyond device 1's budget are paged to the host (offload on
// device 1), never dropped, and come back identical.
TEST(CudaEngineDevices, CopiesBeyondTheDestinationsBudgetArePagedNotDropped) {
  const std::vector<at::Tensor> reference0 = ChainFrom(Input(11), 7, 12);
  FakeDevice device(1024 * kKiB, /*devices=*/2);
  ASSERT_TRUE(device.SetBudget(1, 448 * kKiB).ok());
  const at::Tensor x0 = Input(11);
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 0).ok());
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kAlways, 1).ok());
  const std::vector<at::Tensor> ys0 = ChainFrom(x0, 7, 12);
  std::vector<at::Tensor> copies;
  for (const at::Tensor& y : ys0) {  // 12 x 64 KiB into 448 KiB
    device.Use(1);
    at::Tensor copy = at::empty({128, 128});
    device.Use(0);
    copy.copy_(y);
    copies.push_back(copy);
  }
  absl::StatusOr<BridgeStats> stats1 = GetEngineStats(1);
  ASSERT_TRUE(stats1.ok());
  EXPECT_GT(stats1->engine.page_outs, 0);
  EXPECT_EQ(stats1->engine.evictions, 0);  // nothing on device 1 could be recomputed
  for (std::size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(SameBytes(at::sin(copies[i]), at::sin(reference0[i]))) << i;  // paged back in to be read
  }
  EXPECT_GT(GetEngineStats(1)->engine.page_ins, 0);
  EXPECT_LE(device.Stats(1).allocated_bytes.peak, static_cast<std::int64_t>(device.budget(1)));
  copies.resize(3);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
  for (std::size_t i = 0; i < copies.size(); ++i) EXPECT_TRUE(SameBytes(copies[i], reference0[i])) << i;
}

// DDP: each process uses cuda:rank. The engine on device 1 alone tracks the ops on device 1 (current there, as after
// torch.cuda.set_device(rank)); device 0's arena is never touched.
TEST(CudaEngineDevices, TheEngineOnDeviceOneAloneIsBitwiseIdentical) {
  const std::vector<at::Tensor> reference = ChainFrom(Input(11), 7, 24);
  FakeDevice device(704 * kKiB, /*devices=*/2);
  device.Use(1);
  const at::Tensor x = Input(11);
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 1).ok());
  EXPECT_EQ(RematEngineDevices(), std::vector<int>{1});
  std::vector<at::Tensor> ys = ChainFrom(x, 7, 24);
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
  absl::StatusOr<BridgeStats> stats = GetEngineStats(1);
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.evictions, 0);
  EXPECT_GT(stats->engine.rematerializations, 0);
  EXPECT_EQ(GetEngineStats(0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_LE(device.Stats(1).allocated_bytes.peak, static_cast<std::int64_t>(device.budget(1)));
  EXPECT_EQ(device.Stats(0).allocated_bytes.peak, 0);
  ys.resize(3);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

// The chain without its dropout: no random stream shared between threads.
std::vector<at::Tensor> Steps(const at::Tensor& x, int n) { return Chain(x, n, /*dropout=*/false); }

// Two threads, each on its own device, under pressure at the same time, each copying every fourth value to the other's
// device: the engines run in parallel, each op routed per thread, and copies in opposite directions take the two
// engines' locks in the same order (no deadlock).
TEST(CudaEngineDevices, TwoThreadsOnTwoDevicesCopyingToEachOtherStayIdentical) {
  constexpr int kSteps = 16;
  const std::vector<at::Tensor> reference[2] = {Steps(Input(11), kSteps), Steps(Input(12), kSteps)};
  FakeDevice device(704 * kKiB, /*devices=*/2);
  device.Use(1);
  const at::Tensor x1 = Input(12);
  device.Use(0);
  const at::Tensor x0 = Input(11);
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 0).ok());
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 1).ok());
  constexpr int kCopies = 48;  // then both threads copy at once, over and over, into one tensor on the other device
  std::vector<at::Tensor> ys[2];
  std::vector<at::Tensor> copies[2];  // copies[d]: device d's values, copied to the other device
  at::Tensor last[2];
  std::atomic<int> ready{0};
  auto run = [&](int d, const at::Tensor& x) {
    const ScopedHook hook;  // this thread's ops are seen, as the enabling thread's are
    device.Use(d);
    ys[d] = Steps(x, kSteps);  // the copies below read values its engine may have evicted since
    for (int i = 3; i < kSteps; i += 4) {
      device.Use(1 - d);
      at::Tensor copy = at::empty({128, 128});
      device.Use(d);
      copy.copy_(ys[d][static_cast<std::size_t>(i)]);
      copies[d].push_back(copy);
    }
    device.Use(1 - d);
    last[d] = at::empty({128, 128});
    device.Use(d);
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    for (int i = 0; i < kCopies; ++i) last[d].copy_(ys[d][static_cast<std::size_t>(i % kSteps)]);
  };
  std::thread first(run, 0, std::cref(x0));
  std::thread second(run, 1, std::cref(x1));
  first.join();
  second.join();
  for (int d : {0, 1}) {
    ASSERT_EQ(ys[d].size(), static_cast<std::size_t>(kSteps)) << d;
    for (std::size_t i = 0; i < ys[d].size(); ++i) EXPECT_TRUE(SameBytes(ys[d][i], reference[d][i])) << d << ", " << i;
    for (std::size_t j = 0; j < copies[d].size(); ++j) {
      EXPECT_TRUE(SameBytes(copies[d][j], reference[d][4 * j + 3])) << d << ", copy " << j;
    }
    EXPECT_TRUE(SameBytes(last[d], reference[d][(kCopies - 1) % kSteps])) << d;
    EXPECT_GT(GetEngineStats(d)->engine.evictions, 0) << d;
    EXPECT_LE(device.Stats(d).allocated_bytes.peak, static_cast<std::int64_t>(device.budget(d))) << d;
  }
  for (int d : {0, 1}) ys[d].resize(2);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

// fork() with engines on two devices: the fork handlers take and give back both engines' locks, the child starts with
// neither held (it can ask for the engines' state), and the parent goes on.
TEST(CudaEngineDevices, ForkWithEnginesOnTwoDevicesLeavesNoLockHeld) {
  FakeDevice device(704 * kKiB, /*devices=*/2);
  const at::Tensor x0 = Input(11);
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 0).ok());
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kOff, 1).ok());
  std::vector<at::Tensor> ys = Steps(x0, 8);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Both bridges' locks must be free here: Stats takes each.
    const std::vector<DeviceEngineStats> all = GetAllEngineStats();
    ::_exit(all.size() == 2 && all[0].stats.ops > 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::vector<at::Tensor> more = Steps(ys.back(), 8);  // the parent's engines still work
  EXPECT_GT(GetEngineStats(0)->engine.evictions, 0);
  more.clear();
  ys.clear();
  ASSERT_TRUE(DisableRematEngine().ok());
}

// The routing decision on CUDA tensors, as on a GPU (whose kernels cannot run here): storages of remat's CUDA
// allocator on devices 0 and 1 that name their CUDA device, under tensors with the CUDA key, in records of the ops a
// GPU program runs. Only the decision is checked (DeviceRouter::Decide); the chains above run it end to end.
class CudaEngineDevicesRouting : public ::testing::Test {
 protected:
  CudaEngineDevicesRouting() : device_(512 * kKiB, /*devices=*/2) {
    for (int d : {0, 1}) {
      absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory = CudaDeviceMemory::Create(
          device_.cuda.get(), static_cast<c10::DeviceIndex>(d), device_.cuda.get(), c10::DeviceType::CUDA);
      TORCH_CHECK(memory.ok(), memory.status().message());
      memories_.push_back(*std::move(memory));
    }
    // No bridges: a CUDA storage names its device, evicted or not, so the router never asks an engine.
    router_ = std::make_unique<DeviceRouter>(
        std::vector<DeviceEngine>{{0, nullptr, memories_[0].get()}, {1, nullptr, memories_[1].get()}}, nullptr);
  }

  at::Tensor OnDevice(int d) {
    c10::intrusive_ptr<c10::StorageImpl> storage = memories_[static_cast<std::size_t>(d)]->NewStorage(4096);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)),
                                                            c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                            caffe2::TypeMeta::Make<float>());
    t.unsafeGetTensorImpl()->set_sizes_contiguous({1024});
    return t;
  }
  // A record of `name` with `arguments`, as the hook captures it (input storages in argument order).
  static OpRecord Record(const char* name, const char* overload, std::vector<c10::IValue> arguments) {
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    OpRecord record(op, TraitsOf(op));
    for (c10::IValue& value : arguments) {
      if (value.isTensor() && value.toTensor().has_storage()) {
        record.input_storages.push_back(
            c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(value.toTensor().storage().unsafeGetStorageImpl()));
      }
      record.arguments.push_back(std::move(value));
    }
    return record;
  }
  static std::vector<std::pair<int, std::vector<int>>> Sources(std::initializer_list<std::pair<int, std::vector<int>>> s) {
    return s;
  }

  FakeDevice device_;
  std::vector<std::unique_ptr<CudaDeviceMemory>> memories_;
  std::unique_ptr<DeviceRouter> router_;
};

TEST_F(CudaEngineDevicesRouting, OpsGoToTheirTensorsDeviceAndCopiesToTheirDestination) {
  const at::Tensor a0 = OnDevice(0);
  const at::Tensor a1 = OnDevice(1);
  const at::Tensor b1 = OnDevice(1);
  const c10::IValue none;
  // An op on device 1's tensors, whatever the current device.
  DeviceRoute route = router_->Decide(Record("aten::add", "Tensor", {a1, b1, 1}));
  EXPECT_EQ(route.destination, 1);
  EXPECT_FALSE(route.cross_device());
  // x.to("cuda:1"): aten::_to_copy's Device argument is the destination; device 0 reads its input.
  route = router_->Decide(Record("aten::_to_copy", "", {a0, none, none, c10::Device(c10::DeviceType::CUDA, 1), none, false, none}));
  EXPECT_EQ(route.destination, 1);
  EXPECT_EQ(route.sources, Sources({{0, {0}}}));
  // x.cpu(): a device with no engine; the input's engine records it.
  route = router_->Decide(Record("aten::_to_copy", "", {a1, none, none, c10::Device(c10::DeviceType::CPU), none, false, none}));
  EXPECT_EQ(route.destination, 1);
  EXPECT_FALSE(route.cross_device());
  // dst.copy_(src): the written storage's device records it, whichever comes first in the device order.
  route = router_->Decide(Record("aten::copy_", "", {a0, b1, false}));
  EXPECT_EQ(route.destination, 0);
  EXPECT_EQ(route.sources, Sources({{1, {1}}}));
  // A factory: its Device argument, or the current device when it has no index.
  route = router_->Decide(Record("aten::empty", "memory_format",
                                 {c10::List<int64_t>({16}), none, none, c10::Device(c10::DeviceType::CUDA, 1), none, none}));
  EXPECT_EQ(route.destination, 1);
  ASSERT_TRUE(device_.rt.SetDevice(1).ok());
  route = router_->Decide(Record("aten::empty", "memory_format",
                                 {c10::List<int64_t>({16}), none, none, c10::Device(c10::DeviceType::CUDA), none, none}));
  EXPECT_EQ(route.destination, 1);
  ASSERT_TRUE(device_.rt.SetDevice(0).ok());
  // An evicted storage still names its device.
  const at::Tensor evicted = OnDevice(1);
  ASSERT_TRUE(EvictStorage(*evicted.storage().unsafeGetStorageImpl()).ok());
  route = router_->Decide(Record("aten::sin", "", {evicted}));
  EXPECT_EQ(route.destination, 1);
  EXPECT_EQ(router_->EngineOf(*evicted.storage().unsafeGetStorageImpl()), 1);
}

}  // namespace
}  // namespace remat::integration
