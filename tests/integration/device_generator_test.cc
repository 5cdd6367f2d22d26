// Random ops that draw from the default generator of a device other than the CPU (issue 19 item 2: CUDA's Philox
// seed and offset) are replayed with the state they drew from, and ops caught drawing from it undeclared are kept.
//
// There is no GPU here, so the device is an out-of-tree backend's, through torch's own extension point: PrivateUse1
// hooks registered by this test give privateuseone:0 a counter-based generator that behaves as CUDA's Philox one does
// for a kernel (a seed, an offset the kernel takes and advances by what it draws, a 16-byte state). The test ops
// run on CPU tensors and name the device whose generator they draw from with a Device argument, as a factory op's
// `device=` does; remat finds that generator as it finds CUDA's (at::globalContext().defaultGenerator).
#include "integration/device_generator.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sin.h>
#include <c10/core/GeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "integration/engine_session.h"
#include "integration/same_bytes.h"

// GCC 12 warns that passing std::nullopt for a `Generator?` through the typed call reads an uninitialized pointer
// (it does not: the optional is empty); a known false positive of -Wmaybe-uninitialized with intrusive_ptr moves.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace remat::integration {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kKiB = 1024;
const c10::Device kDevice(c10::DeviceType::PrivateUse1, 0);

// A generator like CUDA's: a seed and an offset a kernel takes and advances.
class CounterGenerator final : public c10::GeneratorImpl {
 public:
  explicit CounterGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(std::uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(std::uint64_t offset) override { offset_ = offset; }
  std::uint64_t get_offset() const override { return offset_; }
  std::uint64_t current_seed() const override { return seed_; }
  std::uint64_t seed() override { return seed_; }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16, "CounterGenerator: a state has 16 bytes");
    std::memcpy(&seed_, state.data(), 8);
    std::memcpy(&offset_, static_cast<const char*>(state.data()) + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::detail::empty_cpu({16}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                             std::nullopt);
    std::memcpy(state.data_ptr(), &seed_, 8);
    std::memcpy(static_cast<char*>(state.data_ptr()) + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  CounterGenerator* clone_impl() const override {
    auto* copy = new CounterGenerator(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
  std::uint64_t seed_ = 0;
  std::uint64_t offset_ = 0;
};

struct TestDeviceHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    TORCH_CHECK(index <= 0, "privateuseone:", static_cast<int>(index), " does not exist");
    static const at::Generator generator = at::make_generator<CounterGenerator>(0);
    return generator;
  }
};

[[maybe_unused]] const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new TestDeviceHooks());
  return true;
}();

at::Generator DeviceGenerator() { return at::globalContext().defaultGenerator(kDevice); }

void Seed(std::uint64_t seed) {
  at::Generator generator = DeviceGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

std::uint64_t Offset() {
  at::Generator generator = DeviceGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_offset();
}

// The kernel of a dropout on `device`: takes the generator's seed and offset, advances the offset by what it draws
// (rounded to 4, as CUDA kernels do), and keeps each element with probability 1 - p from a hash of (seed, offset+i).
at::Tensor MaskKernel(const at::Tensor& self, double p, c10::Device device, std::optional<at::Generator> generator) {
  at::Generator source = generator.has_value() ? *generator : at::globalContext().defaultGenerator(device);
  const std::int64_t n = self.numel();
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(source.mutex());
    seed = source.current_seed();
    offset = source.get_offset();
    source.set_offset(offset + static_cast<std::uint64_t>((n + 3) / 4 * 4));
  }
  const at::Tensor in = self.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* x = in.data_ptr<float>();
  float* y = out.data_ptr<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint64_t h = seed ^ ((offset + static_cast<std::uint64_t>(i)) * 0x9E3779B97F4A7C15ull);
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
    y[i] = u < p ? 0.0f : x[i] / static_cast<float>(1.0 - p);
  }
  return out;
}

at::Tensor UndeclaredMaskKernel(const at::Tensor& self, double p, c10::Device device) {
  return MaskKernel(self, p, device, std::nullopt);
}

TORCH_LIBRARY(remat_rng_test, m) {
  // Random by its Generator argument; passed None, it draws from `device`'s default generator.
  m.def("mask(Tensor self, float p, Device device, Generator? generator=None) -> Tensor");
  // The same kernel with nothing in its schema saying it is random.
  m.def("mask_undeclared(Tensor self, float p, Device device) -> Tensor");
}
TORCH_LIBRARY_IMPL(remat_rng_test, CPU, m) {
  m.impl("mask", &MaskKernel);
  m.impl("mask_undeclared", &UndeclaredMaskKernel);
}

at::Tensor Mask(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("remat_rng_test::mask", "")
                             .typed<at::Tensor(const at::Tensor&, double, c10::Device, std::optional<at::Generator>)>();
  return op.call(x, 0.25, kDevice, std::nullopt);
}

at::Tensor UndeclaredMask(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("remat_rng_test::mask_undeclared", "")
                             .typed<at::Tensor(const at::Tensor&, double, c10::Device)>();
  return op.call(x, 0.25, kDevice);
}

std::vector<at::Tensor> MaskChain(const at::Tensor& x, int n) {
  std::vector<at::Tensor> ys;
  at::Tensor y = x;
  for (int i = 0; i < n; ++i) {
    y = Mask(y);
    ys.push_back(y);
  }
  return ys;
}

TEST(DeviceGenerator, TheOpsDeviceIsItsFirstNonCpuTensorOrDeviceArgument) {
  const at::Tensor cpu = at::randn({2});
  EXPECT_EQ(*OpDevice({c10::IValue(cpu), c10::IValue(1.5)}), c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(*OpDevice({c10::IValue(cpu), c10::IValue(kDevice)}), kDevice);
  const absl::StatusOr<c10::Device> two =
      OpDevice({c10::IValue(kDevice), c10::IValue(c10::Device(c10::DeviceType::PrivateUse1, 1))});
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(two.status().message(), HasSubstr("privateuseone:0 and privateuseone:1"));
}

TEST(DeviceGenerator, ADeviceTorchHasNoGeneratorForIsAnErrorNamingIt) {
  EXPECT_TRUE(DefaultGeneratorOf(kDevice).ok());
  const absl::StatusOr<at::Generator> xpu = DefaultGeneratorOf(c10::Device(c10::DeviceType::XPU, 0));
  ASSERT_FALSE(xpu.ok());
  EXPECT_THAT(xpu.status().message(), HasSubstr("no default generator for xpu:0"));
  EXPECT_FALSE(DefaultGeneratorPosition(c10::Device(c10::DeviceType::XPU, 0)).has_value());
}

TEST(DeviceGenerator, ThePositionIsTheGeneratorsSeedAndOffset) {
  Seed(5);
  const at::Tensor x = at::randn({10});
  (void)Mask(x);
  const std::optional<GeneratorPosition> position = DefaultGeneratorPosition(kDevice);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(*position, (GeneratorPosition{5, 12}));
  EXPECT_FALSE(DefaultGeneratorPosition(c10::Device(c10::DeviceType::CPU)).has_value());
}

// Before: an op drawing from a non-CPU default generator was kept (its outputs constants), so 24 masks of 64 KiB
// did not fit in 640 KiB.
TEST(DeviceGeneratorReplay, MasksFromADevicesGeneratorAreEvictedAndReplayedBitwise) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB
  Seed(7);
  const std::vector<at::Tensor> reference = MaskChain(x, 24);
  const std::uint64_t offset_after = Offset();
  {
    EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
    Seed(7);
    const std::vector<at::Tensor> ys = MaskChain(x, 24);
    for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
    absl::StatusOr<BridgeStats> stats = GetEngineStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->engine.evictions, 0);
    EXPECT_GT(stats->engine.rematerializations, 0);
  }
  // Replays lent the generator their captured state and gave it back: the user's stream did not move.
  EXPECT_EQ(Offset(), offset_after);
}

// Before: the watch looked at the CPU generator only, so a mask drawn undeclared from the device's generator was
// evicted like any op and replayed at the generator's later offset: other bytes, and the offset moved.
TEST(DeviceGeneratorReplay, AnOpCaughtDrawingFromADevicesGeneratorUndeclaredIsKept) {
  const at::Tensor x = at::randn({128, 128});
  auto run = [&](std::vector<at::Tensor>* masks, std::vector<at::Tensor>* sines) {
    at::Tensor s = x;
    for (int i = 0; i < 16; ++i) {
      masks->push_back(UndeclaredMask(s));
      s = at::sin(masks->back());
      sines->push_back(s);
    }
  };
  Seed(9);
  std::vector<at::Tensor> reference_masks;
  std::vector<at::Tensor> reference_sines;
  run(&reference_masks, &reference_sines);
  const std::uint64_t offset_after = Offset();
  {
    // The 16 masks must stay (1 MiB); the sines share what is left. lru: each mask is last read before its sine
    // is, so a mask taken for replayable would be the first victim.
    EngineGuard guard(EngineSessionOptions{(16 + 6) * 64 * kKiB, "lru"});
    Seed(9);
    std::vector<at::Tensor> masks;
    std::vector<at::Tensor> sines;
    run(&masks, &sines);
    for (std::size_t i = 0; i < masks.size(); ++i) {
      EXPECT_TRUE(SameBytes(masks[i], reference_masks[i])) << i;
      EXPECT_TRUE(SameBytes(sines[i], reference_sines[i])) << i;
    }
    absl::StatusOr<BridgeStats> stats = GetEngineStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->engine.rematerializations, 0);
  }
  EXPECT_EQ(Offset(), offset_after);
}

}  // namespace
}  // namespace remat::integration
