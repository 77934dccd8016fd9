// Reference sparse prefill: hand-computed cases, the dense float64 golden on
// random cases, and the topk_length / invalid-index / sink contracts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>

#include "smla/attention.h"
#include "tests/common/test_common.h"
#include "tests/unit/reference/dense_golden.h"
#include "tests/unit/reference/hand_case.h"

namespace smla::testing {
namespace {

using hand::bf16_tol;
using hand::f32_at;
using hand::out_at;
using testkit::HostTensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kDim = 512;

// q = 2 e0 + 1 e1, scale 0.5: s0 = 1, s1 = 1, s2 = -1 (rows: hand::FourRowPrefill).
struct FourRows : hand::FourRowPrefill {
  FourRows() : FourRowPrefill(2.0f, 1.0f) {}
};

TEST(ReferencePrefillHand, ThreeRowsWithInvalidIndicesSkipped) {
  FourRows c;
  // -1, other negatives and >= s_kv are not attended.
  c.indices = hand::i32_matrix({{2, -1, 0, 4, -5, 1, std::numeric_limits<std::int32_t>::max()}});
  ASSERT_TRUE(IsOk(sparse_prefill(c.args(), Backend::kReference)));
  const double w0 = std::exp(1.0), w1 = std::exp(1.0), w2 = std::exp(-1.0), den = w0 + w1 + w2;
  EXPECT_NEAR(out_at(c.out.view(), 0, 0, 0), (w0 - w2) / den, bf16_tol((w0 - w2) / den));
  EXPECT_NEAR(out_at(c.out.view(), 0, 0, 1), 2 * w1 / den, bf16_tol(2 * w1 / den));
  EXPECT_NEAR(out_at(c.out.view(), 0, 0, 2), w2 / den, bf16_tol(w2 / den));
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 3), 0.0f);
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(den), 1e-6);
  EXPECT_NEAR(f32_at(c.max_logits.view(), 0, 0), 1.0, 1e-7);
}

TEST(ReferencePrefillHand, TopkLengthOneIgnoresLaterIndices) {
  FourRows c;
  c.indices = hand::i32_matrix({{2, 3, 0}});  // row 3 is NaN: must stay unread
  c.topk_length = hand::i32_vector({1});
  c.sink = hand::f32_vector({0.0f});
  ASSERT_TRUE(IsOk(sparse_prefill(c.args(), Backend::kReference)));
  const double w2 = std::exp(-1.0), den = w2 + 1.0;  // sink 0 adds exp(0)
  EXPECT_NEAR(out_at(c.out.view(), 0, 0, 0), -w2 / den, bf16_tol(w2 / den));
  EXPECT_NEAR(out_at(c.out.view(), 0, 0, 2), w2 / den, bf16_tol(w2 / den));
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), -1.0, 1e-6);
  EXPECT_NEAR(f32_at(c.max_logits.view(), 0, 0), -1.0, 1e-7);
}

TEST(ReferencePrefillHand, EmptyRowGivesZeroInfiniteLseAndMinusInfiniteMaxLogit) {
  FourRows c;
  c.indices = hand::i32_matrix({{-1, 4, 0}});
  c.topk_length = hand::i32_vector({2});
  ASSERT_TRUE(IsOk(sparse_prefill(c.args(), Backend::kReference)));
  for (int d = 0; d < kDim; ++d) ASSERT_EQ(out_at(c.out.view(), 0, 0, d), 0.0f) << "dim " << d;
  EXPECT_EQ(f32_at(c.lse.view(), 0, 0), kInf);
  EXPECT_EQ(f32_at(c.max_logits.view(), 0, 0), -kInf);
}

TEST(ReferencePrefillHand, SinkPlusInfinityZeroesTheOutput) {
  FourRows c;
  c.indices = hand::i32_matrix({{0, 1}});
  c.sink = hand::f32_vector({kInf});
  ASSERT_TRUE(IsOk(sparse_prefill(c.args(), Backend::kReference)));
  for (int d = 0; d < kDim; ++d) ASSERT_EQ(out_at(c.out.view(), 0, 0, d), 0.0f) << "dim " << d;
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(2 * std::exp(1.0)), 1e-6);
}

struct PrefillGoldenCase {
  std::string name;
  testkit::PrefillCaseOptions options;
};
// gtest prints the case name instead of the raw bytes.
void PrintTo(const PrefillGoldenCase& c, std::ostream* os) { *os << c.name; }

class ReferencePrefillGolden : public ::testing::TestWithParam<PrefillGoldenCase> {};

TEST_P(ReferencePrefillGolden, MatchesDenseFloat64Golden) {
  testkit::PrefillCaseOptions options = GetParam().options;
  options.seed = test_seed();
  SMLA_SEED_TRACE(options.seed);
  testkit::PrefillCase c = testkit::make_prefill_case(options);
  const SparsePrefillArgs args = c.args();
  ASSERT_TRUE(IsOk(sparse_prefill(args, Backend::kReference)));
  EXPECT_TRUE(testkit::all_written(args.out));
  EXPECT_TRUE(testkit::all_written(args.lse));
  EXPECT_TRUE(testkit::all_written(args.max_logits));
  const golden::Result want = golden::prefill(args);
  const HostTensor want_out = golden::out_tensor(want, options.s_q);
  const HostTensor want_lse = golden::f32_tensor(want.lse, options.s_q, options.num_heads);
  const HostTensor want_max = golden::f32_tensor(want.max_logit, options.s_q, options.num_heads);
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(args.out, want_out.view(), {1e-6, 1.0 / 128, 1e-6}), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(args.lse, want_lse.view(), {1e-6, 1e-5, 1e-9}), "lse"));
  EXPECT_TRUE(
      WithinTolerance(testkit::compare_f32(args.max_logits, want_max.view(), {1e-6, 1e-6, 1e-9}), "max_logits"));
}

std::vector<PrefillGoldenCase> prefill_cases() {
  testkit::PrefillCaseOptions base;
  base.s_q = 4;
  base.s_kv = 64;
  base.num_heads = 4;
  base.topk = 24;
  std::vector<PrefillGoldenCase> cases{{"basic", base}};
  auto strided = base;
  strided.strided = true;
  strided.invalid_fraction = 0.4;
  cases.push_back({"strided_hostile", strided});
  auto v32 = base;
  v32.d_qk = 576;
  v32.topk_length = false;
  cases.push_back({"v32_head_dim_576", v32});
  auto few_rows = base;  // topk wider than s_kv: padding with -1
  few_rows.s_kv = 10;
  few_rows.sink = false;
  cases.push_back({"topk_wider_than_kv", few_rows});
  for (std::int64_t heads : {1, 3, 128}) {
    auto h = base;
    h.num_heads = heads;
    h.s_q = 2;
    cases.push_back({"heads_" + std::to_string(heads), h});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferencePrefillGolden, ::testing::ValuesIn(prefill_cases()),
                         [](const ::testing::TestParamInfo<PrefillGoldenCase>& param) { return param.param.name; });

}  // namespace
}  // namespace smla::testing
