// Every validation rule of sparse_decode / sparse_prefill: the call fails,
// the message names the argument, and nothing is written.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "smla/attention.h"
#include "testkit/testkit.h"
#include "tests/common/test_common.h"

namespace smla::testing {
namespace {

using testkit::HostTensor;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr Device kCuda{DeviceKind::kCuda, 0};

struct DecodeRule {
  std::string name;
  std::function<void(SparseDecodeArgs&, std::vector<HostTensor>&)> break_args;
  StatusCode code;
  std::vector<std::string> needles;  // all must appear in the message
};
// gtest prints the case name instead of the raw bytes.
void PrintTo(const DecodeRule& c, std::ostream* os) { *os << c.name; }

testkit::DecodeCase small_decode_case() {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = 3;  // T = 6
  o.num_heads = 4;
  o.main_topk = 8;
  o.main_page_size = 4;
  o.main_context = 20;
  o.extra_topk = 16;
  o.extra_page_size = 3;
  o.extra_context = 20;
  return testkit::make_decode_case(o);
}

// A tensor shaped [shape] with any dtype, kept alive by `keep`.
TensorView tensor(std::vector<HostTensor>& keep, DType dtype, const std::vector<std::int64_t>& shape,
                  const std::vector<std::int64_t>& strides = {}) {
  keep.push_back(HostTensor::zeros(dtype, shape, strides));
  return keep.back().view();
}

std::vector<DecodeRule> decode_rules() {
  using A = SparseDecodeArgs;
  using K = std::vector<HostTensor>;
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  return {
      {"q_absent", [](A& a, K&) { a.q = TensorView{}; }, kInvalid, {"q:", "absent"}},
      {"q_dtype",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kF32, {6, 4, 512});
       },
       kInvalid,
       {"q:", "bf16", "f32"}},
      {"q_rank",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {6, 2048});
       },
       kInvalid,
       {"q:", "rank 3"}},
      {"q_head_dim",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {6, 4, 576});
       },
       kInvalid,
       {"q:", "d_qk=512", "576"}},
      {"q_last_dim_strided",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {6, 4, 512}, {4096, 1024, 2});
       },
       kInvalid,
       {"q:", "contiguous last dimension"}},
      {"q_no_heads",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {6, 0, 512});
       },
       kInvalid,
       {"q", "[1, 128]", "0"}},
      {"q_too_many_heads",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {6, 129, 512});
       },
       kInvalid,
       {"q", "[1, 128]", "129"}},
      {"q_device", [](A& a, K&) { a.q.device = kCuda; }, kInvalid, {"q:", "cpu", "cuda"}},
      {"main_cache_absent", [](A& a, K&) { a.main_cache.pages = TensorView{}; }, kInvalid, {"main_cache"}},
      {"main_cache_row_size",
       [](A& a, K& k) {
         a.main_cache.pages = tensor(k, DType::kU8, {4, 4, 656});
       },
       kInvalid,
       {"main_cache", "584"}},
      {"main_cache_device", [](A& a, K&) { a.main_cache.pages.device = kCuda; }, kInvalid, {"main_cache", "cuda"}},
      {"main_indices_absent", [](A& a, K&) { a.main_indices = TensorView{}; }, kInvalid, {"main_indices", "absent"}},
      {"main_indices_dtype",
       [](A& a, K& k) {
         a.main_indices = tensor(k, DType::kI64, {6, 8});
       },
       kInvalid,
       {"main_indices", "i32", "i64"}},
      {"main_indices_tokens",
       [](A& a, K& k) {
         a.main_indices = tensor(k, DType::kI32, {5, 128});
       },
       kInvalid,
       {"main_indices: expected shape [T=6, k_main], got [5, 128]"}},
      {"main_indices_last_dim_strided",
       [](A& a, K& k) {
         a.main_indices = tensor(k, DType::kI32, {6, 8}, {16, 2});
       },
       kInvalid,
       {"main_indices", "contiguous"}},
      {"main_indices_device", [](A& a, K&) { a.main_indices.device = kCuda; }, kInvalid, {"main_indices", "cuda"}},
      {"main_lengths_shape",
       [](A& a, K& k) { a.main_lengths = tensor(k, DType::kI32, {5}); },
       kInvalid,
       {"main_lengths", "[T=6]", "[5]"}},
      {"main_lengths_dtype",
       [](A& a, K& k) { a.main_lengths = tensor(k, DType::kI64, {6}); },
       kInvalid,
       {"main_lengths", "i32"}},
      {"main_lengths_negative",
       [](A& a, K&) { a.main_lengths.ptr<std::int32_t>()[2] = -1; },
       StatusCode::kOutOfRange,
       {"main_lengths[2]", "[0, 8]", "-1"}},
      {"main_lengths_too_long",
       [](A& a, K&) { a.main_lengths.ptr<std::int32_t>()[5] = 9; },
       StatusCode::kOutOfRange,
       {"main_lengths[5]", "[0, 8]", "9"}},
      {"extra_cache_format",
       [](A& a, K& k) {
         a.extra_cache->pages = tensor(k, DType::kBF16, {4, 3, 512});
         a.extra_cache->format = KvFormat::kBf16Rows;
       },
       kInvalid,
       {"extra_cache", "v4-fp8", "bf16-rows"}},
      {"extra_cache_device", [](A& a, K&) { a.extra_cache->pages.device = kCuda; }, kInvalid, {"extra_cache", "cuda"}},
      {"extra_indices_missing",
       [](A& a, K&) { a.extra_indices = TensorView{}; },
       kInvalid,
       {"extra_indices", "required with extra_cache"}},
      {"extra_cache_other_format",
       [](A& a, K&) { a.extra_cache->format = KvFormat::kV32Fp8; },
       kInvalid,
       {"extra_cache", "format v4-fp8", "v32-fp8"}},
      {"extra_indices_without_cache",
       [](A& a, K&) {
         a.extra_cache.reset();
         a.extra_lengths = TensorView{};
       },
       kInvalid,
       {"extra_indices", "no extra_cache"}},
      {"extra_lengths_without_cache",
       [](A& a, K&) {
         a.extra_cache.reset();
         a.extra_indices = TensorView{};
       },
       kInvalid,
       {"extra_lengths", "no extra_cache"}},
      {"extra_indices_tokens",
       [](A& a, K& k) {
         a.extra_indices = tensor(k, DType::kI32, {7, 16});
       },
       kInvalid,
       {"extra_indices", "[T=6, k_extra]", "[7, 16]"}},
      {"extra_indices_dtype",
       [](A& a, K& k) {
         a.extra_indices = tensor(k, DType::kU8, {6, 16});
       },
       kInvalid,
       {"extra_indices", "i32", "u8"}},
      {"extra_lengths_shape",
       [](A& a, K& k) {
         a.extra_lengths = tensor(k, DType::kI32, {6, 1});
       },
       kInvalid,
       {"extra_lengths", "rank 1"}},
      {"extra_lengths_device", [](A& a, K&) { a.extra_lengths.device = kCuda; }, kInvalid, {"extra_lengths", "cuda"}},
      {"extra_lengths_too_long",
       [](A& a, K&) { a.extra_lengths.ptr<std::int32_t>()[0] = 17; },
       StatusCode::kOutOfRange,
       {"extra_lengths[0]", "[0, 16]", "17"}},
      {"sink_shape", [](A& a, K& k) { a.sink = tensor(k, DType::kF32, {5}); }, kInvalid, {"sink", "[h_q=4]", "[5]"}},
      {"sink_dtype", [](A& a, K& k) { a.sink = tensor(k, DType::kBF16, {4}); }, kInvalid, {"sink", "f32"}},
      {"sink_device", [](A& a, K&) { a.sink.device = kCuda; }, kInvalid, {"sink", "cuda"}},
      {"scale_zero", [](A& a, K&) { a.softmax_scale = 0.0f; }, kInvalid, {"softmax_scale", "> 0"}},
      {"scale_negative", [](A& a, K&) { a.softmax_scale = -0.5f; }, kInvalid, {"softmax_scale", "-0.5"}},
      {"scale_nan", [](A& a, K&) { a.softmax_scale = kNan; }, kInvalid, {"softmax_scale", "nan"}},
      {"scale_inf", [](A& a, K&) { a.softmax_scale = kInf; }, kInvalid, {"softmax_scale", "inf"}},
      {"out_absent", [](A& a, K&) { a.out = TensorView{}; }, kInvalid, {"out:", "absent"}},
      {"out_dtype",
       [](A& a, K& k) {
         a.out = tensor(k, DType::kF32, {6, 4, 512});
       },
       kInvalid,
       {"out:", "bf16"}},
      {"out_value_dim",
       [](A& a, K& k) {
         a.out = tensor(k, DType::kBF16, {6, 4, 576});
       },
       kInvalid,
       {"out:", "d_v=512", "576"}},
      {"out_heads",
       [](A& a, K& k) {
         a.out = tensor(k, DType::kBF16, {6, 8, 512});
       },
       kInvalid,
       {"out:", "h_q=4"}},
      {"out_device", [](A& a, K&) { a.out.device = kCuda; }, kInvalid, {"out:", "cuda"}},
      {"out_last_dim_strided",
       [](A& a, K& k) {
         a.out = tensor(k, DType::kBF16, {6, 4, 512}, {4096, 1024, 2});
       },
       kInvalid,
       {"out:", "contiguous"}},
      {"out_null_data", [](A& a, K&) { a.out.data = nullptr; }, kInvalid, {"out:", "nullptr"}},
      {"lse_shape",
       [](A& a, K& k) {
         a.lse = tensor(k, DType::kF32, {4, 6});
       },
       kInvalid,
       {"lse:", "[T=6, h_q=4]"}},
      {"lse_dtype",
       [](A& a, K& k) {
         a.lse = tensor(k, DType::kBF16, {6, 4});
       },
       kInvalid,
       {"lse:", "f32"}},
      {"token_order_shape",
       [](A& a, K& k) { a.token_order = tensor(k, DType::kI32, {5}); },
       kInvalid,
       {"token_order", "[T=6]", "[5]"}},
      {"token_order_dtype",
       [](A& a, K& k) { a.token_order = tensor(k, DType::kI64, {6}); },
       kInvalid,
       {"token_order", "i32", "i64"}},
      {"token_order_strided",
       [](A& a, K& k) { a.token_order = tensor(k, DType::kI32, {6}, {2}); },
       kInvalid,
       {"token_order", "contiguous"}},
      {"token_order_device",
       [](A& a, K& k) {
         a.token_order = tensor(k, DType::kI32, {6});
         a.token_order.device = kCuda;
       },
       kInvalid,
       {"token_order", "cuda"}},
      {"token_order_ready_without_buffer",
       [](A& a, K&) { a.token_order_ready = true; },
       kInvalid,
       {"token_order", "token_order_ready", "absent"}},
  };
}

class DecodeValidation : public ::testing::TestWithParam<DecodeRule> {};

TEST_P(DecodeValidation, FailsNamingTheArgumentAndWritesNothing) {
  testkit::DecodeCase c = small_decode_case();
  SparseDecodeArgs args = c.args();
  std::vector<HostTensor> keep;
  keep.reserve(4);
  GetParam().break_args(args, keep);
  const Status status = sparse_decode(args, Backend::kReference);
  EXPECT_TRUE(FailsWith(status, GetParam().code, GetParam().needles));
  EXPECT_EQ(testkit::count_poisoned(c.out().view()), c.out().view().numel());
  EXPECT_EQ(testkit::count_poisoned(c.lse().view()), c.lse().view().numel());
}

INSTANTIATE_TEST_SUITE_P(Rules, DecodeValidation, ::testing::ValuesIn(decode_rules()),
                         [](const ::testing::TestParamInfo<DecodeRule>& param) { return param.param.name; });

TEST(DecodeValidationOk, OptionalTensorsMayBeAbsent) {
  testkit::DecodeCase c = small_decode_case();
  SparseDecodeArgs args = c.args();
  args.main_lengths = TensorView{};
  args.extra_lengths = TensorView{};
  args.sink = TensorView{};
  args.lse = TensorView{};
  EXPECT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
  args.extra_cache.reset();
  args.extra_indices = TensorView{};
  EXPECT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
}

// The step's token order is a hint the reference (like every backend but the
// Hopper kernel's ordering plans) ignores: any values, ready or not.
TEST(DecodeValidationOk, TokenOrderValuesAreNotRead) {
  testkit::DecodeCase c = small_decode_case();
  SparseDecodeArgs args = c.args();
  HostTensor order = HostTensor::zeros(DType::kI32, {6});
  for (std::int64_t t = 0; t < 6; ++t) order.view().ptr<std::int32_t>()[t] = t % 2 == 0 ? -5 : 1000;
  args.token_order = order.view();
  for (bool ready : {false, true}) {
    args.token_order_ready = ready;
    EXPECT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
  }
}

TEST(DecodeValidationOk, OutOfRangeIndexValuesAreNotErrors) {
  testkit::DecodeCase c = small_decode_case();
  SparseDecodeArgs args = c.args();
  const std::int32_t hostile[] = {-1, -7, std::numeric_limits<std::int32_t>::min(),
                                  std::numeric_limits<std::int32_t>::max(),
                                  static_cast<std::int32_t>(args.main_cache.num_slots())};
  for (std::int64_t k = 0; k < args.main_indices.shape[1]; ++k) {
    args.main_indices.ptr<std::int32_t>()[k] = hostile[k % 5];
  }
  EXPECT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
}

TEST(DecodeValidationOk, PaddedStridesAreAccepted) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 1;
  o.num_heads = 3;
  o.main_topk = 8;
  o.main_context = 12;
  o.extra_topk = 4;
  o.extra_context = 9;
  o.strided = true;
  testkit::DecodeCase c = testkit::make_decode_case(o);
  EXPECT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
}

struct PrefillRule {
  std::string name;
  std::function<void(SparsePrefillArgs&, std::vector<HostTensor>&)> break_args;
  StatusCode code;
  std::vector<std::string> needles;
};
// gtest prints the case name instead of the raw bytes.
void PrintTo(const PrefillRule& c, std::ostream* os) { *os << c.name; }

testkit::PrefillCase small_prefill_case() {
  testkit::PrefillCaseOptions o;
  o.s_q = 5;
  o.s_kv = 40;
  o.num_heads = 4;
  o.topk = 16;
  return testkit::make_prefill_case(o);
}

std::vector<PrefillRule> prefill_rules() {
  using A = SparsePrefillArgs;
  using K = std::vector<HostTensor>;
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  return {
      {"q_absent", [](A& a, K&) { a.q = TensorView{}; }, kInvalid, {"q:", "absent"}},
      {"q_dtype",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kF32, {5, 4, 512});
       },
       kInvalid,
       {"q:", "bf16"}},
      {"q_head_dim",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {5, 4, 128});
       },
       kInvalid,
       {"d_qk=128"}},
      {"q_too_many_heads",
       [](A& a, K& k) {
         a.q = tensor(k, DType::kBF16, {5, 129, 512});
       },
       kInvalid,
       {"q", "129"}},
      {"q_device", [](A& a, K&) { a.q.device = kCuda; }, kInvalid, {"q:", "cuda"}},
      {"d_v", [](A& a, K&) { a.d_v = 256; }, kInvalid, {"d_v=256"}},
      {"kv_absent", [](A& a, K&) { a.kv = TensorView{}; }, kInvalid, {"kv:", "absent"}},
      {"kv_head_dim",
       [](A& a, K& k) {
         a.kv = tensor(k, DType::kBF16, {40, 576});
       },
       kInvalid,
       {"kv:", "d_qk=512", "576"}},
      {"kv_rank",
       [](A& a, K& k) {
         a.kv = tensor(k, DType::kBF16, {40, 1, 512});
       },
       kInvalid,
       {"kv:", "rank 2"}},
      {"kv_last_dim_strided",
       [](A& a, K& k) {
         a.kv = tensor(k, DType::kBF16, {40, 512}, {1024, 2});
       },
       kInvalid,
       {"kv:", "contiguous"}},
      {"indices_tokens",
       [](A& a, K& k) {
         a.indices = tensor(k, DType::kI32, {4, 16});
       },
       kInvalid,
       {"indices: expected shape [s_q=5, topk], got [4, 16]"}},
      {"indices_dtype",
       [](A& a, K& k) {
         a.indices = tensor(k, DType::kI64, {5, 16});
       },
       kInvalid,
       {"indices", "i32"}},
      {"topk_length_shape",
       [](A& a, K& k) {
         a.topk_length = tensor(k, DType::kI32, {5, 1});
       },
       kInvalid,
       {"topk_length", "rank 1"}},
      {"topk_length_value",
       [](A& a, K&) { a.topk_length.ptr<std::int32_t>()[3] = 17; },
       StatusCode::kOutOfRange,
       {"topk_length[3]", "[0, 16]", "17"}},
      {"sink_shape", [](A& a, K& k) { a.sink = tensor(k, DType::kF32, {3}); }, kInvalid, {"sink", "[h_q=4]"}},
      {"sink_dtype", [](A& a, K& k) { a.sink = tensor(k, DType::kF64, {4}); }, kInvalid, {"sink", "f32"}},
      {"kv_dtype",
       [](A& a, K& k) {
         a.kv = tensor(k, DType::kF32, {40, 512});
       },
       kInvalid,
       {"kv:", "bf16"}},
      {"kv_device", [](A& a, K&) { a.kv.device = kCuda; }, kInvalid, {"kv:", "cuda"}},
      {"indices_device", [](A& a, K&) { a.indices.device = kCuda; }, kInvalid, {"indices", "cuda"}},
      {"topk_length_dtype",
       [](A& a, K& k) { a.topk_length = tensor(k, DType::kI64, {5}); },
       kInvalid,
       {"topk_length", "i32"}},
      {"topk_length_negative",
       [](A& a, K&) { a.topk_length.ptr<std::int32_t>()[0] = -2; },
       StatusCode::kOutOfRange,
       {"topk_length[0]", "-2"}},
      {"scale_zero", [](A& a, K&) { a.softmax_scale = 0.0f; }, kInvalid, {"softmax_scale"}},
      {"out_shape",
       [](A& a, K& k) {
         a.out = tensor(k, DType::kBF16, {5, 4, 576});
       },
       kInvalid,
       {"out:", "d_v=512"}},
      {"max_logits_shape",
       [](A& a, K& k) {
         a.max_logits = tensor(k, DType::kF32, {5, 3});
       },
       kInvalid,
       {"max_logits", "[s_q=5, h_q=4]"}},
      {"lse_dtype",
       [](A& a, K& k) {
         a.lse = tensor(k, DType::kF64, {5, 4});
       },
       kInvalid,
       {"lse:", "f32", "f64"}},
      {"lse_device", [](A& a, K&) { a.lse.device = kCuda; }, kInvalid, {"lse:", "cuda"}},
  };
}

class PrefillValidation : public ::testing::TestWithParam<PrefillRule> {};

TEST_P(PrefillValidation, FailsNamingTheArgumentAndWritesNothing) {
  testkit::PrefillCase c = small_prefill_case();
  SparsePrefillArgs args = c.args();
  std::vector<HostTensor> keep;
  keep.reserve(4);
  GetParam().break_args(args, keep);
  const Status status = sparse_prefill(args, Backend::kReference);
  EXPECT_TRUE(FailsWith(status, GetParam().code, GetParam().needles));
  EXPECT_EQ(testkit::count_poisoned(c.out().view()), c.out().view().numel());
  EXPECT_EQ(testkit::count_poisoned(c.lse().view()), c.lse().view().numel());
  EXPECT_EQ(testkit::count_poisoned(c.max_logits().view()), c.max_logits().view().numel());
}

INSTANTIATE_TEST_SUITE_P(Rules, PrefillValidation, ::testing::ValuesIn(prefill_rules()),
                         [](const ::testing::TestParamInfo<PrefillRule>& param) { return param.param.name; });

}  // namespace
}  // namespace smla::testing
