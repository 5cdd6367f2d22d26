// The engine on a CUDA device's arena (CudaDeviceMemory over RematCudaAllocator, EnableRematEngineOn), run against
// the CUDA-runtime test double. The double's "device memory" is host memory, so the test makes CPU tensors over it:
// a c10 CPU allocator that allocates from the CUDA allocator (FakeDevice, tests/cuda/fake_device.h) is installed, and
// real CPU kernels run on the device arena's blocks. What runs is the CUDA path's own code: the device arena
// (budget, streams, pending stream-ordered frees), its pressure handler calling the engine, CudaDeviceMemory's
// allocations, slides and copies through the CudaRuntime seam, and the engine session without a CPU arena.
#include "integration/same_bytes.h"
#include "integration/cuda/cuda_device_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda/fake_cuda_runtime.h"
#include "tests/cuda/fake_device.h"
#include "integration/engine_session.h"
#include "tests/integration/arena_layout_workload.h"
#include "tests/integration/chain_workload.h"

namespace remat::integration {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kKiB = 1024;

std::vector<at::Tensor> Reference(int seed, int n) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB
  at::manual_seed(seed);
  return Chain(x, n);
}

class CudaEngine : public ::testing::TestWithParam<const char*> {};

// 24 x 64 KiB stay alive under a budget of 11: three times the budget. Every value is the unconstrained run's; with
// `stitch_granule` > 0 the arena stitches (evictions give their granules back wherever they lie, and the device
// never holds more physical memory than the budget).
void CheckChainUnderATightBudget(const char* policy, std::size_t stitch_granule) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(7, 24);  // made before the fake device: plain host memory
  FakeDevice device(704 * kKiB, 1, stitch_granule);
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});  // on the device: a constant for remat
  ASSERT_TRUE(device.Enable(policy).ok());
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 24);
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.evictions, 0);
  EXPECT_GT(stats->engine.rematerializations, 0);
  const cuda::DeviceArenaStats arena = device.Stats();
  EXPECT_LE(arena.allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  EXPECT_GT(arena.pressure_allocations, 0);
  EXPECT_EQ(arena.stitched, stitch_granule > 0);
  if (stitch_granule > 0) {
    EXPECT_LE(arena.peak_physical_bytes, device.budget());
    EXPECT_LE(device.rt.device_bytes_in_use(0), device.budget());
    EXPECT_GT(arena.stitch.maps, 0u);
  }
  // Disabling brings every live tensor back into the device's memory, under its budget: keep what fits.
  std::vector<at::Tensor> kept;
  for (std::size_t i = 0; i < ys.size(); i += 6) kept.push_back(ys[i]);
  ys.clear();
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
  for (std::size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(SameBytes(kept[i], reference[6 * i])) << i;
}

TEST_P(CudaEngine, ChainUnderATightDeviceBudgetIsBitwiseIdentical) { CheckChainUnderATightBudget(GetParam(), 0); }

// (Steals, unmapping an evicted storage's granules for another range, happen where the arena places a block at a new
// address; CudaStitchArena.EvictedBlocksGiveTheirGranules... checks them.)
TEST_P(CudaEngine, ChainOnAStitchedArenaIsBitwiseIdentical) { CheckChainUnderATightBudget(GetParam(), 64 * kKiB); }

// Relocation on the device (DeviceArena::TryAllocate and a copy through the runtime): under ten 64 KiB blocks,
// five constants (written behind the hook's back) alternate with five activations, which are then dropped; a
// 128 KiB result needs a constant moved out of the way, with its bytes.
TEST(CudaEngineMemory, ConstantsMoveOutOfTheWayWithTheirBytes) {
  const at::Tensor small = at::randn({128, 128});  // made before the fake device: outside its arena
  const at::Tensor big = at::randn({256, 128});
  const at::Tensor expected = at::sin(big);
  FakeDevice device(640 * kKiB);
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  const ConstantsBetweenHoles layout = ConstantsBetweenHoles::Make(small);
  const at::Tensor y = at::sin(big);
  EXPECT_TRUE(SameBytes(y, expected));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  // They move out of the way (relocated) or slide together (compacted, before any eviction): either way, with
  // their bytes.
  EXPECT_GE(layout.ExpectBytesKept(), 1);
  EXPECT_GE(stats->engine.relocations + stats->engine.compactions, 1);
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  // The bytes moved through cudaMemcpyAsync.
  EXPECT_GE(device.rt.counters().copies,
            static_cast<std::uint64_t>(stats->engine.relocations + stats->engine.compactions));
}

// A slide on the device (DeviceArena::Move: the block list and the bytes, copied on the block's stream): x sits
// between two 64 KiB holes of a 192 KiB budget and cat(x, x) needs 128 KiB while its kernel reads x, so the kernel
// runs out of memory; the hook runs it again once the engine has slid x down onto the first hole.
TEST(CudaEngineMemory, AKernelWhoseInputSplitsTheFreeBytesRunsAgainAfterASlide) {
  const at::Tensor small = at::randn({128, 128});  // outside the device's arena
  const at::Tensor expected = at::cat({at::sin(small), at::sin(small)});
  FakeDevice device(192 * kKiB);
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  const InputBetweenHoles layout = InputBetweenHoles::Make(small);
  ASSERT_TRUE(layout.laid_out) << "x did not land between its two 64 KiB neighbours";
  const at::Tensor& x = layout.x;
  const std::uintptr_t base = layout.base;
  ASSERT_LT(device.Stats().largest_free_block, 128 * kKiB);
  const at::Tensor y = at::cat({x, x});
  EXPECT_TRUE(SameBytes(y, expected));
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->retried_ops, 1);
  EXPECT_GE(stats->engine.compactions, 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x.const_data_ptr()), base);  // slid down onto the first hole
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
}

// torch.cuda.set_per_process_memory_fraction while the engine runs would release the arena the engine works in.
TEST(CudaEngineMemory, TheBudgetDoesNotChangeUnderTheEngine) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(5, 12);
  FakeDevice device(512 * kKiB);
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  cuda::DeviceArena& arena = device.cuda->Device(0);
  const Arena* before = arena.arena();
  const absl::Status changed = arena.SetBudgetFraction(0.5);
  EXPECT_EQ(changed.code(), absl::StatusCode::kFailedPrecondition) << changed;
  EXPECT_THAT(std::string(changed.message()), HasSubstr("disable the engine first"));
  EXPECT_EQ(arena.arena(), before);
  at::manual_seed(5);
  std::vector<at::Tensor> ys = Chain(x, 12);  // the engine still works in the same arena
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
  EXPECT_GT(GetEngineStats()->engine.evictions, 0);
  ys.resize(2);
  ASSERT_TRUE(DisableRematEngine().ok());
  // Without the engine, only the tensors still held (x and two results) stand in the way.
  EXPECT_THAT(std::string(arena.SetBudget(1 << 20).message()), HasSubstr("only change while nothing is allocated"));
}

// Copies to and from the host read a device block only once the stream it was made on has finished its work: here
// a kernel still queued on stream A writes the block while the copy is asked for on stream B.
TEST(CudaEngineMemory, PageCopiesWaitForTheStreamThatMadeTheBlock) {
  FakeDevice device(512 * kKiB);
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
      CudaDeviceMemory::Create(device.cuda.get(), 0, device.host.get(), c10::DeviceType::CPU);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const cudaStream_t a = *device.rt.StreamCreate();
  const cudaStream_t b = *device.rt.StreamCreate();
  constexpr std::size_t kBytes = 4096;
  void* block = device.cuda->Malloc(kBytes, 0, a);
  device.rt.HoldStream(a);
  device.rt.Launch(a, [block] { std::memset(block, 0x5A, kBytes); });
  device.current = b;
  std::vector<unsigned char> host(kBytes, 0);
  ASSERT_TRUE((*memory)->CopyToHost(host.data(), block, kBytes).ok());
  EXPECT_EQ(std::count(host.begin(), host.end(), 0x5A), static_cast<std::ptrdiff_t>(kBytes));
  // And a copy into a block waits for the kernels of its stream before it overwrites it.
  device.rt.HoldStream(a);
  device.rt.Launch(a, [block] { std::memset(block, 0x11, kBytes); });
  std::fill(host.begin(), host.end(), 0x77);
  ASSERT_TRUE((*memory)->CopyFromHost(block, host.data(), kBytes).ok());
  const auto* bytes = static_cast<const unsigned char*>(block);
  EXPECT_EQ(std::count(bytes, bytes + kBytes, 0x77), static_cast<std::ptrdiff_t>(kBytes));
  device.rt.ReleaseStream(a);
  device.cuda->Free(block);
}

// A slide copies on the block's own stream; the kernels that read the block next run on the current stream, which
// must be ordered after those copies (the double's ordering model), without the host waiting.
TEST(CudaEngineMemory, TheCurrentStreamIsOrderedAfterASlidesCopiesOnTheBlocksStream) {
  FakeDevice device(512 * kKiB);
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
      CudaDeviceMemory::Create(device.cuda.get(), 0, device.host.get(), c10::DeviceType::CPU);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const cudaStream_t made_on = *device.rt.StreamCreate();
  const cudaStream_t current = *device.rt.StreamCreate();
  device.current = made_on;
  c10::intrusive_ptr<c10::StorageImpl> hole = (*memory)->NewStorage(4096);
  c10::intrusive_ptr<c10::StorageImpl> x = (*memory)->NewStorage(8192);
  const auto to = reinterpret_cast<std::uintptr_t>(hole->data_ptr().get());
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(x->data_ptr().get()), to + 4096);
  hole.reset();
  device.current = current;
  const std::uint64_t syncs = device.rt.counters().synchronizations;
  ASSERT_TRUE((*memory)->Slide(*x, to).ok());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x->data_ptr().get()), to);
  device.rt.LaunchKernel(current, {{to, 8192}}, {}, "reader");
  EXPECT_EQ(device.rt.counters().races, 0u) << ::testing::PrintToString(device.rt.races());
  EXPECT_EQ(device.rt.counters().synchronizations, syncs);
  x.reset();
}

// The engine's storages (page-ins, replay scratch) and copies go to its device whichever device the calling thread
// selected, and the thread's selection is left as it was.
TEST(CudaEngineMemory, StoragesAndCopiesUseTheEnginesDeviceWhicheverTheThreadSelected) {
  FakeDevice device(512 * kKiB, /*devices=*/2);
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
      CudaDeviceMemory::Create(device.cuda.get(), 0, device.cuda.get(), c10::DeviceType::CUDA);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_TRUE(device.rt.SetDevice(1).ok());
  c10::intrusive_ptr<c10::StorageImpl> storage = (*memory)->NewStorage(4096);
  EXPECT_TRUE((*memory)->Owns(storage->data_ptr()));
  EXPECT_EQ(storage->data_ptr().device(), c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_EQ(*device.rt.GetDevice(), 1);
  std::vector<unsigned char> host(4096, 0x3C);
  ASSERT_TRUE((*memory)->CopyFromHost(storage->mutable_data(), host.data(), host.size()).ok());
  EXPECT_EQ(*device.rt.GetDevice(), 1);
  EXPECT_EQ(device.Stats().allocated_bytes.current, 4096);
  storage.reset();
  EXPECT_EQ(device.Stats().allocated_bytes.current, 0);
  ASSERT_TRUE(device.rt.SetDevice(0).ok());
}

TEST(CudaEngineDisable, HoldingMoreThanTheBudgetWhenDisablingIsAnErrorThatSaysSo) {
  at::manual_seed(11);
  FakeDevice device(512 * kKiB);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 12);  // 768 KiB alive
  const absl::Status disabled = DisableRematEngine();
  EXPECT_EQ(disabled.code(), absl::StatusCode::kResourceExhausted) << disabled;
  EXPECT_THAT(std::string(disabled.message()), HasSubstr("CUDA memory budget exhausted"));
  EXPECT_FALSE(RematEngineEnabled());
}

INSTANTIATE_TEST_SUITE_P(Policies, CudaEngine, ::testing::Values("dtr-eq", "coop", "lru"));

// Tells the double about every op as a kernel on the compute stream, reading its inputs' storages and writing its
// outputs' (at the op's end: the CPU kernel has run then, after everything remat did for it), so that the double's
// ordering model checks each against the copies that page those storages out and in. Global: RecordFunction
// callbacks are plain function pointers.
class KernelReporter {
 public:
  KernelReporter(cuda::FakeCudaRuntime* rt, cudaStream_t stream) {
    rt_ = rt;
    stream_ = stream;
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&Start, &End).needsInputs(true).needsOutputs(true));
  }
  ~KernelReporter() {
    at::removeCallback(handle_);
    rt_ = nullptr;
  }

 private:
  // The inputs' storages, taken at the start (the boxed inputs do not outlive it); their bytes' place is read at the
  // end, after remat brought them back.
  struct Inputs final : at::ObserverContext {
    std::vector<c10::intrusive_ptr<c10::StorageImpl>> storages;
  };
  static void AddStorages(const c10::IValue& value, std::vector<c10::intrusive_ptr<c10::StorageImpl>>& out) {
    auto add = [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) {
        out.push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(t.storage().unsafeGetStorageImpl()));
      }
    };
    if (value.isTensor()) {
      add(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) add(t);
    }
  }
  static void AddRange(const c10::StorageImpl& storage, std::vector<cuda::FakeRange>& out) {
    const void* data = storage.data_ptr().get();
    if (data != nullptr && storage.nbytes() > 0) out.push_back({reinterpret_cast<std::uintptr_t>(data), storage.nbytes()});
  }
  static std::unique_ptr<at::ObserverContext> Start(const at::RecordFunction& fn) {
    auto inputs = std::make_unique<Inputs>();
    for (const c10::IValue& input : fn.inputs()) AddStorages(input, inputs->storages);
    return inputs;
  }
  static void End(const at::RecordFunction& fn, at::ObserverContext* context) {
    if (rt_ == nullptr) return;
    std::vector<cuda::FakeRange> reads;
    std::vector<cuda::FakeRange> writes;
    if (context != nullptr) {
      for (const auto& storage : static_cast<Inputs*>(context)->storages) AddRange(*storage, reads);
    }
    std::vector<c10::intrusive_ptr<c10::StorageImpl>> outputs;
    for (const c10::IValue& output : fn.outputs()) AddStorages(output, outputs);
    for (const auto& storage : outputs) AddRange(*storage, writes);
    rt_->LaunchKernel(stream_, reads, writes, fn.name());
  }

  static inline cuda::FakeCudaRuntime* rt_ = nullptr;
  static inline cudaStream_t stream_ = nullptr;
  at::CallbackHandle handle_;
};

TEST(CudaEngineStreams, EvictionsOnTwoStreamsAreReusedAfterPendingUsesAndStayIdentical) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(5, 18);
  FakeDevice device(512 * kKiB);
  absl::StatusOr<cudaStream_t> first = device.rt.StreamCreate();
  absl::StatusOr<cudaStream_t> second = device.rt.StreamCreate();
  ASSERT_TRUE(first.ok() && second.ok());
  device.current = *first;
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  at::manual_seed(5);
  std::vector<at::Tensor> ys = Chain(x, 9);
  device.current = *second;  // torch switched streams: blocks freed from now on wait for their streams' events
  const std::uint64_t races = device.rt.counters().races;
  {
    // The kernels on the second stream must be ordered after what the first stream did to their memory (uses,
    // slides' copies): checked by the double's ordering model, since its CPU kernels run at once.
    KernelReporter reporter(&device.rt, *second);
    std::vector<at::Tensor> more = Chain(ys.back(), 9);
    ys.insert(ys.end(), more.begin(), more.end());
  }
  EXPECT_EQ(device.rt.counters().races, races) << ::testing::PrintToString(device.rt.races());
  // Chain(ys.back(), 9) continues the random stream where Chain(x, 9) left it: the same 18 values.
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
  const cuda::DeviceArenaStats stats = device.Stats();
  EXPECT_TRUE(stats.multi_stream);
  // The engine's frees of the first stream's blocks were reused after their events, in the second stream's order:
  // the host never waited for the first stream.
  EXPECT_GT(stats.stream_ordered_reclaims, 0);
  EXPECT_EQ(stats.synchronizations, 0);
  EXPECT_EQ(device.rt.host_waits_for(*first), 0u);
  EXPECT_GT(GetEngineStats()->engine.evictions, 0);
  EXPECT_LE(stats.allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  ys.resize(4);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

TEST(CudaEngineErrors, TooSmallABudgetRaisesOutOfMemoryErrorSayingWhatHoldsTheMemory) {
  FakeDevice device(192 * kKiB);
  at::manual_seed(1);
  const at::Tensor x = at::randn({64, 64});  // 16 KiB of the 192
  ASSERT_TRUE(device.Enable("dtr-eq").ok());
  const at::Tensor doubled = at::mul(x, 2);  // the engine adopts x as a constant
  try {
    (void)at::empty({3 << 14});  // 192 KiB
    FAIL() << "no OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_THAT(message, HasSubstr("CUDA memory budget exhausted on device 0: tried to allocate 196608 bytes"));
    EXPECT_THAT(message, HasSubstr("locked by the running ops 0, constant 16384 of which 16384 in the arena"));
    EXPECT_THAT(message, HasSubstr("running 'aten::empty.memory_format'"));
    EXPECT_THAT(message, testing::Not(HasSubstr("larger than the whole budget")));
  }
  EXPECT_THAT([] { (void)at::empty({1 << 16}); },  // 256 KiB
              testing::ThrowsMessage<c10::OutOfMemoryError>(
                  HasSubstr("This one request is larger than the whole budget (by 65536 bytes)")));
  // Still usable.
  EXPECT_TRUE(SameBytes(at::div(doubled, 2), x));
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

// Paging on the device goes through the asynchronous pager: victims are copied to pinned host pages on the copy
// stream (cudaMemcpyAsync device-to-host and back, checked by the double against live device and pinned
// allocations) and come back byte-identical when read; nothing is kept in the engine's own host tier.
TEST(CudaEnginePaging, OffloadAlwaysPagesThroughThePagerAndStaysIdentical) {
  at::manual_seed(11);
  const std::vector<at::Tensor> reference = Reference(7, 24);
  FakeDevice device(704 * kKiB);
  at::manual_seed(11);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kAlways).ok());
  const std::uint64_t pinned_before = device.rt.counters().host_allocs;
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 24);
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.page_outs, 0);
  EXPECT_GT(stats->engine.page_ins, 0);
  EXPECT_EQ(stats->executor.page_outs, stats->engine.page_outs);
  EXPECT_EQ(stats->host_tier.stores, 0);  // the pages are the pager's pinned blocks
  EXPECT_GT(device.rt.counters().host_allocs, pinned_before);  // the pinned pool's segment
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  ys.resize(4);
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
  EXPECT_EQ(device.rt.live_host_allocations(), 0u);  // the pool went with the engine
  // What the user kept came back from its pages before they went.
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
}

// A small MLP's forward and backward passes: 8 layers of 128 x 128 (64 KiB) weights.
struct Mlp {
  explicit Mlp(int seed) {
    at::manual_seed(seed);
    x = at::randn({128, 128});
    for (int i = 0; i < 8; ++i) {
      ws.push_back(at::randn({128, 128}).mul_(0.1));
      ws.back().set_requires_grad(true);
    }
  }
  void Step() {
    at::Tensor y = x;
    for (const at::Tensor& w : ws) y = at::tanh(at::mm(y, w));
    at::sum(y).backward();
  }
  std::vector<at::Tensor> Grads() const {
    std::vector<at::Tensor> out;
    for (const at::Tensor& w : ws) out.push_back(w.grad().clone());
    return out;
  }
  at::Tensor x;
  std::vector<at::Tensor> ws;
};

// Issue 19, item 1: a training step with paging makes no host synchronization on the compute stream's behalf
// (cudaStreamSynchronize, cudaEventSynchronize of its events, cudaDeviceSynchronize), and every kernel is ordered after
// the copies its inputs need and every page-out copy after the kernel that produced its block (the double's ordering
// model: no races). Two steps: the second prefetches in the order the first read its pages. Gradients are
// byte-identical to an unconstrained run.
TEST(CudaEnginePaging, ATrainingStepPagesWithoutHostSynchronizationAndKernelsWaitForTheirPages) {
  std::vector<at::Tensor> reference;
  {
    Mlp mlp(3);
    mlp.Step();
    mlp.Step();
    reference = mlp.Grads();
  }
  FakeDevice device(1024 * kKiB);
  const cudaStream_t compute = *device.rt.StreamCreate();
  device.current = compute;
  Mlp mlp(3);  // x and the weights on the device: constants for remat
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kAlways).ok());
  const cuda::FakeCudaCounters before = device.rt.counters();
  {
    KernelReporter reporter(&device.rt, compute);
    mlp.Step();
    const std::int64_t first_step_prefetches = GetEngineStats()->engine.prefetches;
    mlp.Step();
    EXPECT_GT(GetEngineStats()->engine.prefetches, first_step_prefetches);  // in the order the first step read
  }
  const cuda::FakeCudaCounters after = device.rt.counters();
  absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->engine.page_outs, 0);
  EXPECT_GT(stats->engine.page_ins, 0);
  EXPECT_GT(after.checked_kernels - before.checked_kernels, 50u);
  EXPECT_EQ(device.rt.host_waits_for(compute), 0u);
  EXPECT_EQ(after.device_synchronizations, before.device_synchronizations);
  EXPECT_EQ(after.races, before.races) << ::testing::PrintToString(device.rt.races());
  EXPECT_GT(after.stream_waits, before.stream_waits);  // the ordering is on the device
  EXPECT_GT(device.Stats().stream_ordered_reclaims, 0);
  EXPECT_LE(device.Stats().allocated_bytes.peak, static_cast<std::int64_t>(device.budget()));
  const std::vector<at::Tensor> grads = mlp.Grads();
  for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(SameBytes(grads[i], reference[i])) << i;
  std::printf("[ figures ] 2 steps: modelled stall %lld us, %lld page-outs, %lld page-ins, %lld prefetches, %llu kernels checked, "
              "%llu stream waits, %llu host synchronizations (%llu for the compute stream), %lld stream-ordered "
              "reclaims\n",
              static_cast<long long>(stats->engine.stall_ns / 1000), static_cast<long long>(stats->engine.page_outs),
              static_cast<long long>(stats->engine.page_ins),
              static_cast<long long>(stats->engine.prefetches),
              static_cast<unsigned long long>(after.checked_kernels - before.checked_kernels),
              static_cast<unsigned long long>(after.stream_waits - before.stream_waits),
              static_cast<unsigned long long>(after.synchronizations - before.synchronizations),
              static_cast<unsigned long long>(device.rt.host_waits_for(compute)),
              static_cast<long long>(device.Stats().stream_ordered_reclaims));
  mlp.ws.clear();
  const absl::Status disabled = DisableRematEngine();
  ASSERT_TRUE(disabled.ok()) << disabled;
}

// Held storages that do not fit back when the engine is switched off: with paging on, the engine must not page the
// ones it already brought back out again to make room for the next (the host tier dies with the engine), and says
// that what is held does not fit.
TEST(CudaEnginePaging, HoldingMoreThanTheBudgetWhenDisablingIsAnErrorNotALoss) {
  at::manual_seed(11);
  FakeDevice device(512 * kKiB);
  const at::Tensor x = at::randn({128, 128});
  ASSERT_TRUE(device.Enable("dtr-eq", OffloadMode::kAlways).ok());
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 12);  // 768 KiB held
  ASSERT_GT(GetEngineStats()->engine.page_outs, 0);
  const absl::Status disabled = DisableRematEngine();
  EXPECT_EQ(disabled.code(), absl::StatusCode::kResourceExhausted) << disabled;
  EXPECT_FALSE(RematEngineEnabled());
}

TEST(CudaEngineErrors, TheInstalledAllocatorIsNeeded) {
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory = CudaDeviceMemory::ForInstalledAllocator(0);
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(memory.status().message()), HasSubstr("install_cuda_allocator"));
}

}  // namespace
}  // namespace remat::integration
