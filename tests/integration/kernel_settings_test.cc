// Tests for KernelSettings (integration/kernel_settings.h): what a record captures is put in force for a replay and
// the program's own settings come back after it.
#include "integration/kernel_settings.h"

#include <ATen/Context.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarTypeToTypeMeta.h>

#include "gtest/gtest.h"

namespace remat::integration {
namespace {

TEST(KernelSettings, AScopePutsTheCapturedSettingsInForceAndRestoresTheProgramsAfter) {
  at::Context& context = at::globalContext();
  context.setUserEnabledMkldnn(false);
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(c10::kDouble));
  context.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::BF16);
  const KernelSettings captured = KernelSettings::Capture(/*with_precisions=*/true);
  context.setUserEnabledMkldnn(true);
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(c10::kFloat));
  context.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  const KernelSettings program = KernelSettings::Capture(true);
  ASSERT_NE(captured, program);
  {
    KernelSettingsScope scope(captured);
    EXPECT_FALSE(context.userEnabledMkldnn());
    EXPECT_EQ(c10::get_default_dtype_as_scalartype(), c10::kDouble);
    EXPECT_EQ(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL),
              at::Float32Precision::BF16);
    EXPECT_EQ(KernelSettings::Capture(true), captured);
  }
  EXPECT_TRUE(context.userEnabledMkldnn());
  EXPECT_EQ(c10::get_default_dtype_as_scalartype(), c10::kFloat);
  EXPECT_EQ(KernelSettings::Capture(true), program);
}

// Settings captured without precisions (an op whose kernel does not read them) leave the precisions alone.
TEST(KernelSettings, AnOpCapturedWithoutPrecisionsLeavesThemAsTheProgramSetThem) {
  at::Context& context = at::globalContext();
  context.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  const KernelSettings captured = KernelSettings::Capture(/*with_precisions=*/false);
  context.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::BF16);
  {
    KernelSettingsScope scope(captured);
    EXPECT_EQ(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL),
              at::Float32Precision::BF16);
  }
  context.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
}

}  // namespace
}  // namespace remat::integration
