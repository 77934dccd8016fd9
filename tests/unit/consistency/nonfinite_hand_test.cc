// Non-finite values and overflow against hand-computed values (docs/attention.md),
// on the reference and the cpu backend: a flat bf16 prefill over four rows,
// r0 = e0, r1 = 2 e1, r2 = -e0 + e2, r3 = NaN in every dim.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "smla/attention.h"
#include "tests/common/test_common.h"
#include "tests/unit/reference/hand_case.h"

namespace smla::testing {
namespace {

using hand::f32_at;
using hand::out_at;
using testkit::HostTensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct FourRows : hand::FourRowPrefill {
  using FourRowPrefill::FourRowPrefill;
  Status run(Backend backend) { return sparse_prefill(args(), backend); }
  bool out_all_nan() const {
    for (int d = 0; d < kDim; ++d) {
      if (!std::isnan(out_at(out.view(), 0, 0, d))) return false;
    }
    return true;
  }
  bool out_all_zero() const {
    for (int d = 0; d < kDim; ++d) {
      if (out_at(out.view(), 0, 0, d) != 0.0f) return false;
    }
    return true;
  }
};

class NonfiniteHand : public ::testing::TestWithParam<Backend> {};

// scale 3e38, raw dots 2, 2, -2: scaled logits 6e38 (past FLT_MAX), the softmax is
// the mean of r0 and r1 exactly; lse and max_logits report +inf.
TEST_P(NonfiniteHand, LogitsPastF32KeepTheOutputExact) {
  for (const float sink : {-kInf, 0.0f, 1e30f}) {
    SCOPED_TRACE(::testing::Message() << "sink " << sink);
    FourRows c(2.0f, 1.0f);
    c.softmax_scale = 3e38f;
    c.indices = hand::i32_matrix({{0, 1, 2}});
    c.sink = hand::f32_vector({sink});
    ASSERT_TRUE(IsOk(c.run(GetParam())));
    EXPECT_EQ(out_at(c.out.view(), 0, 0, 0), 0.5f);
    EXPECT_EQ(out_at(c.out.view(), 0, 0, 1), 1.0f);
    EXPECT_EQ(out_at(c.out.view(), 0, 0, 2), 0.0f);
    EXPECT_EQ(f32_at(c.lse.view(), 0, 0), kInf);
    EXPECT_EQ(f32_at(c.max_logits.view(), 0, 0), kInf);
  }
}

// The same at scale 1e30: lse = 2e30 + ln 2 rounds to 2e30 in f32, finite.
TEST_P(NonfiniteHand, LargeFiniteLogitsGiveTheSameOutputAndAFiniteLse) {
  FourRows c(2.0f, 1.0f);
  c.softmax_scale = 1e30f;
  c.indices = hand::i32_matrix({{0, 1, 2}});
  c.sink = hand::f32_vector({5.0f});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 0), 0.5f);
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 1), 1.0f);
  EXPECT_FLOAT_EQ(f32_at(c.lse.view(), 0, 0), 2e30f);
  EXPECT_FLOAT_EQ(f32_at(c.max_logits.view(), 0, 0), 2e30f);
}

// +inf sink against logits past f32: still 0, not inf - inf = NaN.
TEST_P(NonfiniteHand, PlusInfinitySinkStillZeroesPastF32) {
  FourRows c(2.0f, 1.0f);
  c.softmax_scale = 3e38f;
  c.indices = hand::i32_matrix({{0, 1}});
  c.sink = hand::f32_vector({kInf});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_TRUE(c.out_all_zero());
  EXPECT_EQ(f32_at(c.lse.view(), 0, 0), kInf);
}

// Raw dots -2, -2: scaled -6e38, below -FLT_MAX. Without sink the mean of r0 and
// r1 with lse -inf; a finite sink outweighs both keys (out 0).
TEST_P(NonfiniteHand, LogitsBelowMinusFltMax) {
  FourRows c(-2.0f, -1.0f);
  c.softmax_scale = 3e38f;
  c.indices = hand::i32_matrix({{0, 1}});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 0), 0.5f);
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 1), 1.0f);
  EXPECT_EQ(f32_at(c.lse.view(), 0, 0), -kInf);
  EXPECT_EQ(f32_at(c.max_logits.view(), 0, 0), -kInf);
  c.sink = hand::f32_vector({0.0f});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_TRUE(c.out_all_zero());
  EXPECT_EQ(f32_at(c.lse.view(), 0, 0), -kInf);
}

// A selected NaN row: out, lse and max_logits NaN (not dropped, not "empty").
TEST_P(NonfiniteHand, SelectedNanRowPropagates) {
  FourRows c(2.0f, 1.0f);
  c.indices = hand::i32_matrix({{0, 3, 1}});
  c.sink = hand::f32_vector({kInf});  // NaN wins over the +inf sink
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_TRUE(c.out_all_nan());
  EXPECT_TRUE(std::isnan(f32_at(c.lse.view(), 0, 0)));
  EXPECT_TRUE(std::isnan(f32_at(c.max_logits.view(), 0, 0)));
}

// NaN in a q dim every row holds as 0: still NaN (0 x NaN).
TEST_P(NonfiniteHand, NanInQPropagates) {
  FourRows c(2.0f, 1.0f);
  c.q.view().ptr<std::uint16_t>()[300] = 0x7FC0;
  c.indices = hand::i32_matrix({{0, 1}});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_TRUE(c.out_all_nan());
  EXPECT_TRUE(std::isnan(f32_at(c.lse.view(), 0, 0)));
  EXPECT_TRUE(std::isnan(f32_at(c.max_logits.view(), 0, 0)));
}

// A NaN sink: out NaN, lse and max_logits (sink excluded) exact: s = 1, 1.
TEST_P(NonfiniteHand, NanSinkMakesOnlyTheOutputNan) {
  FourRows c(2.0f, 1.0f);
  c.indices = hand::i32_matrix({{0, 1}});
  c.sink = hand::f32_vector({kNaN});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_TRUE(c.out_all_nan());
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), 1.0 + std::log(2.0), 1e-6);
  EXPECT_NEAR(f32_at(c.max_logits.view(), 0, 0), 1.0, 1e-7);
}

// Nothing attended: out 0, lse +inf, max_logits -inf whatever q and the sink hold.
TEST_P(NonfiniteHand, EmptyRowIgnoresNanQAndNanSink) {
  FourRows c(kNaN, 1.0f);
  c.indices = hand::i32_matrix({{-1, 3, 4}});
  c.topk_length = hand::i32_vector({1});  // row 3 (NaN) lies past the length
  c.sink = hand::f32_vector({kNaN});
  ASSERT_TRUE(IsOk(c.run(GetParam())));
  EXPECT_TRUE(c.out_all_zero());
  EXPECT_EQ(f32_at(c.lse.view(), 0, 0), kInf);
  EXPECT_EQ(f32_at(c.max_logits.view(), 0, 0), -kInf);
}

INSTANTIATE_TEST_SUITE_P(Backends, NonfiniteHand, ::testing::Values(Backend::kReference, Backend::kCpu),
                         [](const ::testing::TestParamInfo<Backend>& param) {
                           return std::string(param.param == Backend::kReference ? "reference" : "cpu");
                         });

}  // namespace
}  // namespace smla::testing
