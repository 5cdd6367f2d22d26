// integration/out_of_memory.h: remat's out-of-memory error is recognized whatever type it arrives in, and the hook's
// redispatch gives it back its type. The kernels below throw what torch's stable-ABI shim throws for an extension
// (torchvision's roi_align) whose allocation failed: a plain error carrying the allocator's message.
#include "integration/out_of_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <stdexcept>
#include <string>

namespace remat::integration {
namespace {

constexpr const char* kShimMessage =
    "remat: CPU memory budget exhausted: tried to allocate 26191872 bytes (originally from torch_call_dispatcher( "
    "\"aten::new_zeros\") API call failed at torch/csrc/stable/ops.h, line 997)";

at::Tensor UntypedOutOfMemory(const at::Tensor&) { throw std::runtime_error(kShimMessage); }
at::Tensor OtherError(const at::Tensor&) { throw std::runtime_error("index 3 is out of bounds"); }

TORCH_LIBRARY_FRAGMENT(remat_oom_test, m) {
  m.def("untyped_out_of_memory(Tensor a) -> Tensor");
  m.def("other_error(Tensor a) -> Tensor");
}
TORCH_LIBRARY_IMPL(remat_oom_test, CPU, m) {
  m.impl("untyped_out_of_memory", &UntypedOutOfMemory);
  m.impl("other_error", &OtherError);
}

void Redispatch(const char* name) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  torch::jit::Stack stack{c10::IValue(at::ones({2}))};
  RedispatchTypingOutOfMemory(op, c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
}

TEST(OutOfMemoryTest, RecognizesTheAllocatorsMessageInAnyErrorType) {
  EXPECT_TRUE(IsOutOfMemory(std::runtime_error(kShimMessage)));
  EXPECT_TRUE(IsOutOfMemory(std::runtime_error("remat: CUDA memory budget exhausted on device 0: tried ...")));
  EXPECT_TRUE(IsOutOfMemory(c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "CUDA out of memory")));
  EXPECT_FALSE(IsOutOfMemory(std::runtime_error("index 3 is out of bounds")));
  EXPECT_FALSE(IsOutOfMemory(c10::Error({__func__, __FILE__, __LINE__}, "shape mismatch")));
}

TEST(OutOfMemoryTest, TheRedispatchRethrowsAnUntypedOutOfMemoryErrorAsOneAndLeavesOthersAlone) {
  try {
    Redispatch("remat_oom_test::untyped_out_of_memory");
    FAIL() << "the kernel's error was swallowed";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("memory budget exhausted"), std::string::npos);
  }
  try {
    Redispatch("remat_oom_test::other_error");
    FAIL() << "the kernel's error was swallowed";
  } catch (const c10::OutOfMemoryError&) {
    FAIL() << "an error that is not remat's out-of-memory error became one";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("out of bounds"), std::string::npos);
  }
}

}  // namespace
}  // namespace remat::integration
