// The testkit itself: poisoning, comparison metrics and the hostile cases it builds.
#include "testkit/testkit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "tests/common/test_common.h"
#include "tests/unit/reference/dense_golden.h"

namespace smla::testing {
namespace {

using testkit::HostTensor;

HostTensor f32_values(const std::vector<float>& values) {
  HostTensor t = HostTensor::zeros(DType::kF32, {static_cast<std::int64_t>(values.size())});
  std::memcpy(t.bytes(), values.data(), values.size() * sizeof(float));
  return t;
}

TEST(Testkit, PoisonMarksEveryElementAndAllWrittenSeesIt) {
  HostTensor t = HostTensor::zeros(DType::kBF16, {3, 4}, {6, 1});  // padded rows
  testkit::poison(t.view());
  EXPECT_EQ(testkit::count_poisoned(t.view()), 12);
  EXPECT_FALSE(testkit::all_written(t.view()));
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 4; ++j) t.view().ptr<std::uint16_t>()[i * 6 + j] = f32_to_bf16(1.0f);
  }
  EXPECT_TRUE(testkit::all_written(t.view()));
  // Padding is not part of the view: it stays zero.
  EXPECT_EQ(t.view().ptr<std::uint16_t>()[4], 0);
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7FA5)));  // the poison pattern is a NaN
}

TEST(Testkit, CompareCountsErrorsAndNonFiniteMismatches) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  HostTensor want = f32_values({1.0f, 2.0f, -inf, nan, 0.0f});
  HostTensor same = f32_values({1.0f, 2.0f, -inf, nan, 0.0f});
  const testkit::ErrorStats equal = testkit::compare_f32(same.view(), want.view());
  EXPECT_TRUE(equal.passed()) << equal.to_string();
  EXPECT_EQ(equal.count, 5);

  HostTensor off = f32_values({1.0f, 2.5f, -inf, 0.0f, 0.0f});
  const testkit::ErrorStats stats = testkit::compare_f32(off.view(), want.view(), {0.1, 0.1, 1.0});
  EXPECT_FALSE(stats.passed());
  EXPECT_EQ(stats.nan_mismatch, 1);
  EXPECT_EQ(stats.num_outside, 2);
  EXPECT_DOUBLE_EQ(stats.max_abs_err, 0.5);
  EXPECT_DOUBLE_EQ(stats.max_rel_err, 0.25);
  // Within tolerance when abs or rel holds.
  const testkit::ErrorStats loose =
      testkit::compare_f32(off.view(), f32_values({1.0f, 2.0f, -inf, 0.0f, 0.0f}).view(), {0.0, 0.3, 1.0});
  EXPECT_TRUE(loose.passed()) << loose.to_string();

  HostTensor shorter = f32_values({1.0f});
  EXPECT_TRUE(testkit::compare_f32(shorter.view(), want.view()).shape_mismatch);
  EXPECT_TRUE(testkit::compare_bf16(want.view(), want.view()).shape_mismatch);  // wrong dtype
}

TEST(Testkit, CompareFollowsStrides) {
  HostTensor a = HostTensor::zeros(DType::kF32, {2, 2}, {5, 1});
  HostTensor b = HostTensor::zeros(DType::kF32, {2, 2});
  a.view().ptr<float>()[5 + 1] = 3.0f;  // element [1, 1]
  b.view().ptr<float>()[3] = 3.0f;
  EXPECT_TRUE(testkit::compare_f32(a.view(), b.view()).passed());
  b.view().ptr<float>()[2] = 1.0f;
  const testkit::ErrorStats stats = testkit::compare_f32(a.view(), b.view());
  EXPECT_FALSE(stats.passed());
  EXPECT_EQ(stats.worst_index, 2);
}

TEST(Testkit, DecodeCaseIsHostileAndConsistent) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    SCOPED_TRACE(kv_format_name(format));
    testkit::DecodeCaseOptions o;
    o.num_requests = 3;
    o.s_q = 2;
    o.num_heads = 2;
    o.format = format;
    o.main_topk = 12;
    o.main_page_size = 5;
    o.main_context = 30;
    o.extra_topk = format == KvFormat::kV32Fp8 ? 0 : 10;
    o.extra_page_size = 3;
    o.extra_context = 14;
    o.strided = true;
    o.seed = seed;
    ASSERT_TRUE(IsOk(testkit::check_decode_case_options(o)));
    testkit::DecodeCase c = testkit::make_decode_case(o);
    const SparseDecodeArgs a = c.args();
    EXPECT_EQ(c.num_tokens(), 6);
    EXPECT_EQ(c.has_extra(), o.extra_topk > 0);
    EXPECT_FALSE(a.q.is_contiguous());
    EXPECT_FALSE(a.out.is_contiguous());
    EXPECT_GT(a.main_indices.stride[0], a.main_indices.shape[1]);
    EXPECT_EQ(testkit::count_poisoned(a.out), a.out.numel());

    // Attended rows decode to finite values; every other row holds NaN.
    std::vector<std::pair<KvCacheView, std::pair<TensorView, TensorView>>> sets{
        {a.main_cache, {a.main_indices, a.main_lengths}}};
    if (a.extra_cache) sets.push_back({*a.extra_cache, {a.extra_indices, a.extra_lengths}});
    std::int64_t attended = 0;
    for (const auto& [cache, index_set] : sets) {
      const auto& [indices, lengths] = index_set;
      std::set<std::int64_t> selected;
      for (std::int64_t t = 0; t < c.num_tokens(); ++t) {
        const std::int32_t len = lengths.ptr<const std::int32_t>()[t];
        ASSERT_GE(len, 0);
        ASSERT_LE(len, indices.shape[1]);
        std::set<std::int32_t> distinct;
        for (std::int64_t k = 0; k < len; ++k) {
          const std::int32_t slot = golden::read_i32(indices, t, k);
          if (slot < 0) continue;
          ASSERT_LT(slot, cache.num_slots());
          EXPECT_TRUE(distinct.insert(slot).second) << "duplicate slot " << slot;
          selected.insert(slot);
          ++attended;
        }
      }
      ASSERT_FALSE(selected.empty());
      for (std::int64_t slot = 0; slot < cache.num_slots(); ++slot) {
        const std::vector<double> row = golden::decode_slot(cache, slot);
        bool any_nan = false, all_finite = true;
        for (double v : row) {
          any_nan = any_nan || std::isnan(v);
          all_finite = all_finite && std::isfinite(v);
        }
        if (selected.count(slot)) {
          EXPECT_TRUE(all_finite) << "selected slot " << slot;
        } else {
          EXPECT_TRUE(any_nan) << "unselected slot " << slot;
        }
      }
    }
    EXPECT_EQ(attended, c.attended_entries());
  }
}

TEST(Testkit, DecodeCaseIsDeterministicPerSeedAndPermutesPages) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.num_heads = 2;
  o.main_topk = 64;
  o.main_page_size = 4;
  o.main_context = 64;
  o.extra_topk = 0;
  o.seed = 7;
  testkit::DecodeCase a = testkit::make_decode_case(o);
  testkit::DecodeCase b = testkit::make_decode_case(o);
  const SparseDecodeArgs aa = a.args(), bb = b.args();
  ASSERT_EQ(testkit::storage_bytes(aa.main_indices), testkit::storage_bytes(bb.main_indices));
  EXPECT_EQ(std::memcmp(aa.main_indices.data, bb.main_indices.data, testkit::storage_bytes(aa.main_indices)), 0);
  EXPECT_EQ(std::memcmp(aa.q.data, bb.q.data, testkit::storage_bytes(aa.q)), 0);
  // Consecutive logical blocks of a request do not sit in consecutive pages.
  std::int64_t in_order = 0;
  for (std::int64_t k = 4; k < 64; k += 4) {
    const std::int32_t prev = golden::read_i32(aa.main_indices, 1, k - 4),
                       cur = golden::read_i32(aa.main_indices, 1, k);
    in_order += cur / 4 == prev / 4 + 1 ? 1 : 0;
  }
  EXPECT_LT(in_order, 15);
  // Windows: token 1 of request 0 sits at position 63 and attends positions 0..63.
  EXPECT_EQ(aa.main_lengths.ptr<const std::int32_t>()[1], 64);
}

TEST(Testkit, DecodeCaseOptionsAreChecked) {
  testkit::DecodeCaseOptions o;
  o.num_heads = 129;
  EXPECT_TRUE(FailsWith(testkit::check_decode_case_options(o), StatusCode::kInvalidArgument, {"num_heads"}));
  o = {};
  o.main_context = 1;
  o.s_q = 2;
  EXPECT_TRUE(FailsWith(testkit::check_decode_case_options(o), StatusCode::kInvalidArgument, {"main_context"}));
}

TEST(Testkit, PrefillCaseOptionsAreChecked) {
  testkit::PrefillCaseOptions o;
  EXPECT_TRUE(IsOk(testkit::check_prefill_case_options(o)));
  o.query_scale = 0.0;
  EXPECT_TRUE(FailsWith(testkit::check_prefill_case_options(o), StatusCode::kInvalidArgument, {"query_scale", "0"}));
  o.query_scale = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(FailsWith(testkit::check_prefill_case_options(o), StatusCode::kInvalidArgument, {"query_scale"}));
  o = {};
  o.value_scale = -1.0;
  EXPECT_TRUE(FailsWith(testkit::check_prefill_case_options(o), StatusCode::kInvalidArgument, {"value_scale"}));
}

// query_scale multiplies Q alone: with a power of two, every Q value exactly, and
// the same seed gives the same K/V bytes and indices.
TEST(Testkit, PrefillCaseQueryScale) {
  testkit::PrefillCaseOptions o;
  o.s_q = 4;
  o.s_kv = 64;
  o.num_heads = 8;
  o.seed = test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::PrefillCase plain = testkit::make_prefill_case(o);
  o.query_scale = 16.0;
  testkit::PrefillCase scaled = testkit::make_prefill_case(o);
  const SparsePrefillArgs a = plain.args();
  const SparsePrefillArgs b = scaled.args();
  ASSERT_EQ(testkit::storage_bytes(a.q), testkit::storage_bytes(b.q));
  const auto* q_plain = a.q.ptr<const std::uint16_t>();
  const auto* q_scaled = b.q.ptr<const std::uint16_t>();
  for (std::size_t i = 0; i < testkit::storage_bytes(a.q) / 2; ++i) {
    ASSERT_EQ(bf16_to_f32(q_scaled[i]), 16.0f * bf16_to_f32(q_plain[i])) << "q value " << i;
  }
  EXPECT_EQ(std::memcmp(a.kv.data, b.kv.data, testkit::storage_bytes(a.kv)), 0);
  EXPECT_EQ(std::memcmp(a.indices.data, b.indices.data, testkit::storage_bytes(a.indices)), 0);
}

TEST(Testkit, PrefillCaseHasInvalidIndicesAndPoisonedRows) {
  const std::uint64_t seed = test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::PrefillCaseOptions o;
  o.s_q = 6;
  o.s_kv = 50;
  o.num_heads = 2;
  o.topk = 32;
  o.invalid_fraction = 0.3;
  o.seed = seed;
  testkit::PrefillCase c = testkit::make_prefill_case(o);
  const SparsePrefillArgs a = c.args();
  std::set<std::int64_t> attended;
  std::int64_t invalid = 0;
  for (std::int64_t s = 0; s < o.s_q; ++s) {
    const std::int32_t len = a.topk_length.ptr<const std::int32_t>()[s];
    ASSERT_GE(len, 0);
    ASSERT_LE(len, o.topk);
    for (std::int64_t k = 0; k < o.topk; ++k) {
      const std::int32_t i = golden::read_i32(a.indices, s, k);
      if (i < 0 || i >= o.s_kv) {
        ++invalid;
      } else if (k < len) {
        attended.insert(i);
      }
    }
  }
  EXPECT_GT(invalid, 0);
  for (std::int64_t r = 0; r < o.s_kv; ++r) {
    const double first = golden::bf16_value(a.kv.ptr<const std::uint16_t>()[r * a.kv.stride[0]]);
    EXPECT_EQ(std::isnan(first), attended.count(r) == 0) << "row " << r;
  }
}

}  // namespace
}  // namespace smla::testing
