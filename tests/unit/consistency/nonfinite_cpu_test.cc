// Non-finite values and overflow (docs/attention.md): every case of the shared
// table through the float64 reference, checked against the semantics table,
// and through the cpu backend on every SIMD target, compared with the
// reference (NaN and +-inf positions identical, finite values within tolerance).
// The CUDA backend runs the same table in tests/unit/cuda/cuda_nonfinite_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "src/cpu/simd_targets.h"
#include "tests/common/test_common.h"
#include "tests/unit/consistency/nonfinite_cases.h"

namespace smla {
namespace {

using nonfinite::Case;
using nonfinite::CaseSpec;
using nonfinite::Outputs;

// The cpu backend's usual tolerances (docs/cpu_backend.md): f32 accumulation, bf16 output.
const nonfinite::Tolerances kCpuTolerances{{2e-3, 2.0 / 128, 1e-5}, {1e-4, 1e-5, 1e-6}};

class NonfiniteCpu : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(NonfiniteCpu, ReferenceFollowsTheTableAndCpuMatchesIt) {
  const CaseSpec& spec = GetParam();
  const std::uint64_t seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  for (const nonfinite::Shape shape : {nonfinite::Shape{2, 2, 16}, nonfinite::Shape{1, 3, 5}}) {
    Case c = spec.build(shape, seed);
    SCOPED_TRACE(c.name + ", " + shape.name());
    Outputs want;
    ASSERT_TRUE(testing::IsOk(nonfinite::run_host(c, Backend::kReference, &want)));
    const std::string semantics = nonfinite::check_semantics(c, want);
    EXPECT_TRUE(semantics.empty()) << "reference against the semantics table:\n" << semantics;

    for (const cpu::SimdTarget& target : cpu::available_simd_targets()) {
      SCOPED_TRACE("cpu " + target.name);
      cpu::force_simd_target(target.id);
      Outputs got;
      const Status status = nonfinite::run_host(c, Backend::kCpu, &got);
      cpu::force_simd_target(0);
      ASSERT_TRUE(testing::IsOk(status));
      const std::string mismatch = nonfinite::compare(c, got, want, kCpuTolerances);
      EXPECT_TRUE(mismatch.empty()) << mismatch;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, NonfiniteCpu, ::testing::ValuesIn(nonfinite::cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& param) { return std::string(param.param.name); });

// The table must be able to fail: a backend that drops a NaN key (the cpu
// behaviour before this suite) or reports the wrong empty marker is caught.
TEST(NonfiniteCpuSelfCheck, DetectsADroppedNanAndAWrongMarker) {
  const std::uint64_t seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  const CaseSpec* row_nan = nullptr;
  for (const CaseSpec& spec : nonfinite::cases()) {
    if (std::string(spec.name) == "v4_nope_nan_code") row_nan = &spec;
  }
  ASSERT_NE(row_nan, nullptr);
  Case c = row_nan->build(nonfinite::Shape{2, 2, 16}, seed);
  Outputs want;
  ASSERT_TRUE(testing::IsOk(nonfinite::run_host(c, Backend::kReference, &want)));
  ASSERT_TRUE(nonfinite::check_semantics(c, want).empty());

  // A NaN row replaced by finite values, as a backend dropping the key would write.
  Outputs dropped;
  ASSERT_TRUE(testing::IsOk(nonfinite::run_host(c, Backend::kReference, &dropped)));
  bool changed = false;
  for (std::int64_t t = 0; t < c.num_tokens && !changed; ++t) {
    if (c.row(t, 0) != nonfinite::RowKind::kNan) continue;
    dropped.lse.view().ptr<float>()[t * dropped.lse.view().stride[0]] = 1.0f;
    changed = true;
  }
  ASSERT_TRUE(changed) << "the case planted no NaN row";
  EXPECT_FALSE(nonfinite::compare(c, dropped, want, kCpuTolerances).empty());
  EXPECT_FALSE(nonfinite::check_semantics(c, dropped).empty());

  // An element left unwritten keeps the finite sentinel, which must not pass for NaN.
  Outputs unwritten = nonfinite::make_outputs(c);
  EXPECT_FALSE(nonfinite::compare(c, unwritten, want, kCpuTolerances).empty());
}

}  // namespace
}  // namespace smla
