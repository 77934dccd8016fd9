// Reference sparse decode vs an independent dense float64 golden on random,
// hostile cases (NaN in unselected rows, permuted block tables, odd page
// sizes, padded strides, out-of-range indices, random lengths).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>

#include "smla/attention.h"
#include "testkit/testkit.h"
#include "tests/common/test_common.h"
#include "tests/unit/reference/dense_golden.h"

namespace smla::testing {
namespace {

// Both sides compute in float64, so out differs by at most one bf16 rounding
// step and lse by one f32 rounding.
constexpr testkit::Tolerance kOutTolerance{1e-6, 1.0 / 128, 1e-6};
constexpr testkit::Tolerance kLseTolerance{1e-6, 1e-5, 1e-9};

struct GoldenCase {
  std::string name;
  testkit::DecodeCaseOptions options;
};
// gtest prints the case name instead of the raw bytes.
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

void expect_matches_golden(testkit::DecodeCaseOptions options) {
  options.seed = test_seed();
  SMLA_SEED_TRACE(options.seed);
  testkit::DecodeCase c = testkit::make_decode_case(options);
  const SparseDecodeArgs args = c.args();
  ASSERT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
  EXPECT_TRUE(testkit::all_written(args.out));
  EXPECT_TRUE(testkit::all_written(args.lse));

  const golden::Result want = golden::decode(args);
  const testkit::HostTensor want_out = golden::out_tensor(want, c.num_tokens());
  const testkit::HostTensor want_lse = golden::f32_tensor(want.lse, c.num_tokens(), c.num_heads());
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(args.out, want_out.view(), kOutTolerance), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(args.lse, want_lse.view(), kLseTolerance), "lse"));
}

class ReferenceDecodeGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(ReferenceDecodeGolden, MatchesDenseFloat64Golden) { expect_matches_golden(GetParam().options); }

testkit::DecodeCaseOptions small(KvFormat format) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = 2;
  o.num_heads = 4;
  o.format = format;
  o.main_topk = 16;
  o.main_page_size = 8;
  o.main_context = 40;
  o.extra_topk = format == KvFormat::kV32Fp8 ? 0 : 24;
  o.extra_page_size = 4;
  o.extra_context = 30;
  return o;
}

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> cases;
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    const std::string f(kv_format_name(format));
    std::string id;
    for (char ch : f) id += ch == '-' ? '_' : ch;
    cases.push_back({id + "_basic", small(format)});
    auto odd = small(format);
    odd.main_page_size = 3;
    odd.extra_page_size = 37;
    odd.extra_context = 80;
    cases.push_back({id + "_odd_pages", odd});
    auto hostile = small(format);
    hostile.strided = true;
    hostile.random_lengths = true;
    hostile.invalid_index_fraction = 0.3;
    cases.push_back({id + "_strided_hostile", hostile});
  }
  for (std::int64_t heads : {1, 3, 8, 128}) {
    auto o = small(KvFormat::kV4Fp8);
    o.num_heads = heads;
    o.num_requests = 1;
    o.s_q = heads == 128 ? 1 : 2;
    cases.push_back({"heads_" + std::to_string(heads), o});
  }
  auto short_context = small(KvFormat::kV4Fp8);  // windows shorter than W, padded with -1
  short_context.main_context = 5;
  short_context.s_q = 3;
  short_context.extra_context = 7;
  cases.push_back({"short_context", short_context});
  auto v32_extra = small(KvFormat::kV32Fp8);  // the contract allows an extra cache for any format
  v32_extra.extra_topk = 12;
  cases.push_back({"v32_fp8_with_extra_cache", v32_extra});
  auto no_sink = small(KvFormat::kV4Fp8);
  no_sink.sink = false;
  cases.push_back({"no_sink", no_sink});
  auto peaky = small(KvFormat::kBf16Rows);  // large logits: the softmax max subtraction matters
  peaky.value_scale = 4.0;
  cases.push_back({"large_logits", peaky});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceDecodeGolden, ::testing::ValuesIn(golden_cases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& param) { return param.param.name; });

}  // namespace
}  // namespace smla::testing
