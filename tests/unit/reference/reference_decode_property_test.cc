// Properties of the reference sparse decode that hold for any input:
// order independence, split/merge by lse, sink limits, NaN isolation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "smla/attention.h"
#include "testkit/testkit.h"
#include "tests/common/test_common.h"

namespace smla::testing {
namespace {

using testkit::HostTensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr testkit::Tolerance kExact{0.0, 0.0, 0.0};

testkit::DecodeCaseOptions small_case(std::uint64_t seed) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = 2;
  o.num_heads = 8;
  o.main_topk = 16;
  o.main_page_size = 5;
  o.main_context = 50;
  o.extra_topk = 24;
  o.extra_page_size = 7;
  o.extra_context = 40;
  o.random_lengths = true;
  o.seed = seed;
  return o;
}

struct Outputs {
  HostTensor out, lse;
};

// Runs the reference into fresh copies of the case's outputs and returns them.
Outputs run_copy(testkit::DecodeCase& c, const SparseDecodeArgs& args) {
  Outputs o{c.make_out(), c.make_lse()};
  testkit::poison(o.out.view());
  testkit::poison(o.lse.view());
  SparseDecodeArgs a = args;
  a.out = o.out.view();
  a.lse = o.lse.view();
  EXPECT_TRUE(IsOk(sparse_decode(a, Backend::kReference)));
  EXPECT_TRUE(testkit::all_written(a.out));
  EXPECT_TRUE(testkit::all_written(a.lse));
  return o;
}

std::int32_t& index_at(const TensorView& t, std::int64_t i, std::int64_t j) {
  return t.ptr<std::int32_t>()[i * t.stride[0] + j * t.stride[1]];
}
std::int32_t& length_at(const TensorView& t, std::int64_t i) { return t.ptr<std::int32_t>()[i * t.stride[0]]; }

TEST(ReferenceDecodeProperty, PermutingTheIndexOrderChangesNothing) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
  const SparseDecodeArgs args = c.args();
  const Outputs before = run_copy(c, args);
  std::mt19937_64 rng(seed);
  for (std::int64_t t = 0; t < c.num_tokens(); ++t) {
    for (const auto& [indices, lengths] :
         {std::pair{args.main_indices, args.main_lengths}, std::pair{args.extra_indices, args.extra_lengths}}) {
      std::vector<std::int32_t> row;
      for (std::int64_t k = 0; k < length_at(lengths, t); ++k) row.push_back(index_at(indices, t, k));
      std::shuffle(row.begin(), row.end(), rng);
      for (std::size_t k = 0; k < row.size(); ++k) index_at(indices, t, static_cast<std::int64_t>(k)) = row[k];
    }
  }
  const Outputs after = run_copy(c, args);
  // Summation order only moves float64 rounding, far below one bf16 step.
  EXPECT_TRUE(
      WithinTolerance(testkit::compare_bf16(after.out.view(), before.out.view(), {1e-6, 1.0 / 256, 1e-9}), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(after.lse.view(), before.lse.view(), {1e-6, 1e-6, 1e-9}), "lse"));
}

TEST(ReferenceDecodeProperty, MergingTheTwoHalvesByLseEqualsTheWhole) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
  const SparseDecodeArgs whole_args = c.args();
  const Outputs whole = run_copy(c, whole_args);

  // Half A: main keys only; half B: extra keys only; neither with the sink.
  const HostTensor zero_lengths = HostTensor::zeros(DType::kI32, {c.num_tokens()});
  SparseDecodeArgs a_args = whole_args;
  a_args.extra_lengths = zero_lengths.view();
  a_args.sink = TensorView{};
  SparseDecodeArgs b_args = whole_args;
  b_args.main_lengths = zero_lengths.view();
  b_args.sink = TensorView{};
  const Outputs a = run_copy(c, a_args);
  const Outputs b = run_copy(c, b_args);

  HostTensor merged_out = c.make_out();
  HostTensor merged_lse = c.make_lse();
  double max_value = 0.0;
  for (std::int64_t t = 0; t < c.num_tokens(); ++t) {
    for (std::int64_t h = 0; h < c.num_heads(); ++h) {
      auto lse_of = [&](const HostTensor& x) {
        return static_cast<double>(x.view().ptr<const float>()[t * x.view().stride[0] + h * x.view().stride[1]]);
      };
      const double la = lse_of(a.lse), lb = lse_of(b.lse);
      const double sink = whole_args.sink.ptr<const float>()[h];
      double m = -kInf;
      for (double l : {la, lb, sink}) {
        if (std::isfinite(l)) m = std::max(m, l);
      }
      const double wa = std::isfinite(la) ? std::exp(la - m) : 0.0;
      const double wb = std::isfinite(lb) ? std::exp(lb - m) : 0.0;
      const double den = wa + wb + (std::isfinite(sink) ? std::exp(sink - m) : 0.0);
      merged_lse.view().ptr<float>()[t * merged_lse.view().stride[0] + h] =
          static_cast<float>(wa + wb > 0 ? m + std::log(wa + wb) : kInf);
      for (std::int64_t d = 0; d < c.d_v(); ++d) {
        auto out_of = [&](const HostTensor& x) {
          const TensorView& v = x.view();
          return static_cast<double>(bf16_to_f32(v.ptr<const std::uint16_t>()[t * v.stride[0] + h * v.stride[1] + d]));
        };
        const double value = den > 0 ? (wa * out_of(a.out) + wb * out_of(b.out)) / den : 0.0;
        max_value = std::max(max_value, std::fabs(value));
        const TensorView& v = merged_out.view();
        v.ptr<std::uint16_t>()[t * v.stride[0] + h * v.stride[1] + d] = f32_to_bf16(static_cast<float>(value));
      }
    }
  }
  // The halves are bf16-rounded before the merge, and cancellation near zero
  // magnifies that relatively: abs bound of 1e-2 of the largest value.
  const testkit::Tolerance out_tolerance{1e-2 * max_value, 2.0 / 128, 1e-5};
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(merged_out.view(), whole.out.view(), out_tolerance), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(merged_lse.view(), whole.lse.view(), {1e-6, 1e-5, 1e-9}), "lse"));
}

TEST(ReferenceDecodeProperty, SinkMinusInfinityEqualsNoSink) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
  SparseDecodeArgs args = c.args();
  for (std::int64_t h = 0; h < c.num_heads(); ++h) args.sink.ptr<float>()[h] = -std::numeric_limits<float>::infinity();
  const Outputs with_sink = run_copy(c, args);
  args.sink = TensorView{};
  const Outputs without = run_copy(c, args);
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(with_sink.out.view(), without.out.view(), kExact), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(with_sink.lse.view(), without.lse.view(), kExact), "lse"));
}

TEST(ReferenceDecodeProperty, SinkPlusInfinityGivesZerosAndKeepsLse) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
  SparseDecodeArgs args = c.args();
  args.sink = TensorView{};
  const Outputs without = run_copy(c, args);
  const HostTensor inf_sink = [&] {
    HostTensor s = HostTensor::zeros(DType::kF32, {c.num_heads()});
    for (std::int64_t h = 0; h < c.num_heads(); ++h) s.view().ptr<float>()[h] = std::numeric_limits<float>::infinity();
    return s;
  }();
  args.sink = inf_sink.view();
  const Outputs zeroed = run_copy(c, args);
  const HostTensor zeros = c.make_out();
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(zeroed.out.view(), zeros.view(), kExact), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(zeroed.lse.view(), without.lse.view(), kExact), "lse"));
}

TEST(ReferenceDecodeProperty, NanInEveryUnselectedRowNeverReachesTheOutput) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    SCOPED_TRACE(kv_format_name(format));
    auto options = small_case(seed);
    options.format = format;
    options.extra_topk = format == KvFormat::kV32Fp8 ? 0 : options.extra_topk;
    options.invalid_index_fraction = 0.25;
    options.strided = true;
    testkit::DecodeCase c = testkit::make_decode_case(options);
    const SparseDecodeArgs args = c.args();
    ASSERT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
    for (std::int64_t t = 0; t < c.num_tokens(); ++t) {
      for (std::int64_t h = 0; h < c.num_heads(); ++h) {
        const float lse = args.lse.ptr<const float>()[t * args.lse.stride[0] + h];
        ASSERT_FALSE(std::isnan(lse)) << "token " << t << " head " << h;
        for (std::int64_t d = 0; d < c.d_v(); ++d) {
          const float v =
              bf16_to_f32(args.out.ptr<const std::uint16_t>()[t * args.out.stride[0] + h * args.out.stride[1] + d]);
          ASSERT_TRUE(std::isfinite(v)) << "token " << t << " head " << h << " dim " << d;
        }
      }
    }
  }
}

TEST(ReferenceDecodeProperty, ZeroLengthsGiveZerosAndInfiniteLse) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
  SparseDecodeArgs args = c.args();
  const HostTensor zero_lengths = HostTensor::zeros(DType::kI32, {c.num_tokens()});
  args.main_lengths = zero_lengths.view();
  args.extra_lengths = zero_lengths.view();
  ASSERT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
  const HostTensor zeros = c.make_out();
  HostTensor infinities = c.make_lse();
  for (std::int64_t t = 0; t < c.num_tokens(); ++t) {
    for (std::int64_t h = 0; h < c.num_heads(); ++h) {
      infinities.view().ptr<float>()[t * infinities.view().stride[0] + h] = std::numeric_limits<float>::infinity();
    }
  }
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(args.out, zeros.view(), kExact), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(args.lse, infinities.view(), kExact), "lse"));
}

TEST(ReferenceDecodeProperty, LseIsOptional) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
  SparseDecodeArgs args = c.args();
  const Outputs with_lse = run_copy(c, args);
  args.lse = TensorView{};
  ASSERT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(args.out, with_lse.out.view(), kExact), "out"));
}

}  // namespace
}  // namespace smla::testing
