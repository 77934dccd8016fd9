// The cpu backend's attention ops against a float64 oracle written here (rows
// decoded with the shared row codec, softmax with sink in double), on every
// SIMD target compiled in, plus thread-count determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "smla/attention.h"
#include "src/core/kv_rows.h"
#include "src/cpu/simd_targets.h"
#include "src/cpu/thread_pool.h"
#include "testkit/testkit.h"
#include "tests/common/test_common.h"

namespace smla {
namespace {

using testkit::HostTensor;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// float64 oracle: out = sum_j e^{s_j} v_j / (e^{sink} + sum_j e^{s_j}),
// lse = log sum_j e^{s_j}; empty rows give out 0, lse +inf, max logit -inf.

struct OracleOutputs {
  HostTensor out;  // bf16 [T, h, d_v]
  HostTensor lse;  // f32 [T, h]
  HostTensor max_logits;  // f32 [T, h]
};

double bf16_at(const TensorView& t, std::int64_t offset) { return bf16_to_f32(t.ptr<const std::uint16_t>()[offset]); }

// rows: the attended rows of one token (d_qk doubles each).
void oracle_token(const TensorView& q, std::int64_t token, const std::vector<std::vector<double>>& rows,
                  double scale, const TensorView& sink, int d_v, OracleOutputs* result) {
  const std::int64_t heads = q.shape[1];
  const std::int64_t d_qk = q.shape[2];
  for (std::int64_t h = 0; h < heads; ++h) {
    std::vector<double> logits;
    double max_logit = -kInf;
    for (const auto& row : rows) {
      double dot = 0.0;
      for (std::int64_t i = 0; i < d_qk; ++i) dot += bf16_at(q, token * q.stride[0] + h * q.stride[1] + i) * row[i];
      logits.push_back(dot * scale);
      max_logit = std::max(max_logit, dot * scale);
    }
    double sum = 0.0;
    std::vector<double> acc(static_cast<std::size_t>(d_v), 0.0);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      const double p = std::exp(logits[j] - max_logit);
      sum += p;
      for (int i = 0; i < d_v; ++i) acc[i] += p * rows[j][i];
    }
    const double sink_logit = sink.present() ? sink.ptr<const float>()[h * sink.stride[0]] : -kInf;
    const double denominator = sum + std::exp(sink_logit - max_logit);
    auto* out = result->out.view().ptr<std::uint16_t>() + (token * heads + h) * d_v;
    for (int i = 0; i < d_v; ++i) {
      out[i] = f32_to_bf16(rows.empty() ? 0.0f : static_cast<float>(acc[i] / denominator));
    }
    result->lse.view().ptr<float>()[token * heads + h] =
        static_cast<float>(rows.empty() ? kInf : max_logit + std::log(sum));
    result->max_logits.view().ptr<float>()[token * heads + h] = static_cast<float>(rows.empty() ? -kInf : max_logit);
  }
}

OracleOutputs make_outputs(std::int64_t tokens, std::int64_t heads, int d_v) {
  return {HostTensor::zeros(DType::kBF16, {tokens, heads, d_v}), HostTensor::zeros(DType::kF32, {tokens, heads}),
          HostTensor::zeros(DType::kF32, {tokens, heads})};
}

// Appends the attended rows of one index set of one token.
void paged_rows(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths, std::int64_t token,
                std::vector<std::vector<double>>* rows) {
  const std::int64_t width = indices.shape[1];
  const std::int64_t length = lengths.present() ? lengths.ptr<const std::int32_t>()[token * lengths.stride[0]] : width;
  const KvFormatInfo info = kv_format_info(cache.format);
  for (std::int64_t j = 0; j < length; ++j) {
    const std::int64_t slot = indices.ptr<const std::int32_t>()[token * indices.stride[0] + j];
    if (slot < 0 || slot >= cache.num_slots()) continue;
    std::int64_t entry = 0;
    const std::uint8_t* page = detail::page_of_slot(cache, slot, &entry);
    std::vector<float> row(static_cast<std::size_t>(info.head_dim));
    visit_kv_format(cache.format, [&](auto format) {
      detail::decode_token<decltype(format)>(page, cache.page_size(), entry, cache.fp8_scale, row.data());
    });
    rows->emplace_back(row.begin(), row.end());
  }
}

OracleOutputs oracle_decode(const SparseDecodeArgs& args) {
  const std::int64_t tokens = args.q.shape[0];
  const int d_v = kv_format_info(args.main_cache.format).value_dim;
  OracleOutputs result = make_outputs(tokens, args.q.shape[1], d_v);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::vector<double>> rows;
    paged_rows(args.main_cache, args.main_indices, args.main_lengths, t, &rows);
    if (args.extra_cache.has_value()) paged_rows(*args.extra_cache, args.extra_indices, args.extra_lengths, t, &rows);
    oracle_token(args.q, t, rows, args.softmax_scale, args.sink, d_v, &result);
  }
  return result;
}

OracleOutputs oracle_prefill(const SparsePrefillArgs& args) {
  const std::int64_t tokens = args.q.shape[0];
  const std::int64_t s_kv = args.kv.shape[0];
  const std::int64_t d_qk = args.kv.shape[1];
  OracleOutputs result = make_outputs(tokens, args.q.shape[1], args.d_v);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t width = args.indices.shape[1];
    const std::int64_t length =
        args.topk_length.present() ? args.topk_length.ptr<const std::int32_t>()[t * args.topk_length.stride[0]] : width;
    std::vector<std::vector<double>> rows;
    for (std::int64_t j = 0; j < length; ++j) {
      const std::int64_t index = args.indices.ptr<const std::int32_t>()[t * args.indices.stride[0] + j];
      if (index < 0 || index >= s_kv) continue;
      std::vector<double> row(static_cast<std::size_t>(d_qk));
      for (std::int64_t i = 0; i < d_qk; ++i) row[i] = bf16_at(args.kv, index * args.kv.stride[0] + i);
      rows.push_back(std::move(row));
    }
    oracle_token(args.q, t, rows, args.softmax_scale, args.sink, args.d_v, &result);
  }
  return result;
}

// bf16 output: two bf16 ulps or a small absolute error (outputs are O(0.1)).
const testkit::Tolerance kOutTolerance{2e-3, 2.0 / 128, 1e-5};
const testkit::Tolerance kLseTolerance{1e-4, 1e-5, 1e-6};

// Runs `body` once per SIMD target compiled in and supported here.
template <class BODY>
void for_each_simd_target(BODY&& body) {
  const auto targets = cpu::available_simd_targets();
  ASSERT_FALSE(targets.empty());
  for (const auto& target : targets) {
    cpu::force_simd_target(target.id);
    SCOPED_TRACE("simd target " + target.name);
    body();
    cpu::force_simd_target(0);
  }
}

// ---------------------------------------------------------------------------

struct DecodeConfig {
  std::int64_t heads;
  KvFormat format;
  std::int64_t main_page;
  std::int64_t extra_topk;
  std::int64_t extra_page;
  bool random_lengths;
  bool strided;
  int s_q = 2;
};

std::string config_name(const DecodeConfig& c) {
  return fmt::format("h{} {} main_page {} extra {}/{} random_lengths {} strided {} s_q {}", c.heads,
                     kv_format_name(c.format), c.main_page, c.extra_topk, c.extra_page, c.random_lengths, c.strided,
                     c.s_q);
}

testkit::DecodeCaseOptions decode_options(const DecodeConfig& c, std::uint64_t seed) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = c.s_q;
  o.num_heads = c.heads;
  o.format = c.format;
  o.main_topk = 24;
  o.main_page_size = c.main_page;
  o.main_context = 80;
  o.extra_topk = c.extra_topk;
  o.extra_page_size = c.extra_page;
  o.extra_context = 96;
  o.random_lengths = c.random_lengths;
  o.strided = c.strided;
  o.invalid_index_fraction = 0.1;
  o.seed = seed;
  return o;
}

void expect_decode_matches_oracle(const DecodeConfig& config) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE(fmt::format("{} seed {} (SMLA_TEST_SEED reruns it)", config_name(config), seed));
  const testkit::DecodeCaseOptions options = decode_options(config, seed);
  ASSERT_TRUE(testing::IsOk(testkit::check_decode_case_options(options)));
  testkit::DecodeCase c = testkit::make_decode_case(options);
  const OracleOutputs want = oracle_decode(c.args());
  for_each_simd_target([&] {
    const SparseDecodeArgs args = c.args();  // poisons out and lse again
    ASSERT_TRUE(testing::IsOk(sparse_decode(args, Backend::kCpu)));
    EXPECT_TRUE(testkit::all_written(args.out));
    EXPECT_TRUE(testkit::all_written(args.lse));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_bf16(args.out, want.out.view(), kOutTolerance), "out"));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_f32(args.lse, want.lse.view(), kLseTolerance), "lse"));
  });
}

TEST(CpuSparseDecode, MatchesFloat64OracleForOddHeadCounts) {
  for (std::int64_t heads : {1, 3, 8, 16, 64, 128}) {
    expect_decode_matches_oracle({heads, KvFormat::kV4Fp8, 64, 40, 64, false, false});
  }
}

TEST(CpuSparseDecode, MatchesFloat64OracleForOddPageSizesAndLengths) {
  expect_decode_matches_oracle({5, KvFormat::kV4Fp8, 3, 40, 7, true, false});
  expect_decode_matches_oracle({16, KvFormat::kV4Fp8, 1, 40, 2, true, true});
  expect_decode_matches_oracle({64, KvFormat::kV4Fp8, 256, 200, 64, true, true});
}

TEST(CpuSparseDecode, MatchesFloat64OracleForEveryFormat) {
  expect_decode_matches_oracle({8, KvFormat::kV32Fp8, 5, 0, 64, true, true});
  expect_decode_matches_oracle({3, KvFormat::kBf16Rows, 7, 40, 3, true, true});
  expect_decode_matches_oracle({3, KvFormat::kFp8Rows, 7, 40, 3, false, true});
  expect_decode_matches_oracle({16, KvFormat::kV4Fp8, 64, 0, 64, false, false});  // SWA-only layer
}

// One attended row and no sink: out is that row's value (probability 1), so
// the vectorized dequantization must match the shared row codec bit for bit.
TEST(CpuSparseDecode, SingleRowOutputIsTheExactlyDecodedRow) {
  const std::uint64_t seed = testing::test_seed();
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    SCOPED_TRACE(fmt::format("{} seed {}", kv_format_name(format), seed));
    testkit::DecodeCaseOptions o = decode_options({3, format, 5, 0, 64, false, true}, seed);
    o.main_topk = 1;
    o.sink = false;
    o.invalid_index_fraction = 0.0;
    o.value_scale = 0.01;  // small values reach the e4m3 subnormal codes
    testkit::DecodeCase c = testkit::make_decode_case(o);
    const OracleOutputs want = oracle_decode(c.args());
    for_each_simd_target([&] {
      const SparseDecodeArgs args = c.args();
      ASSERT_TRUE(testing::IsOk(sparse_decode(args, Backend::kCpu)));
      const testkit::ErrorStats stats = testkit::compare_bf16(args.out, want.out.view());
      EXPECT_EQ(stats.max_abs_err, 0.0) << stats.to_string();
      EXPECT_EQ(stats.nan_mismatch, 0) << stats.to_string();
      EXPECT_FALSE(stats.shape_mismatch);
      EXPECT_GT(stats.count, 0);
    });
  }
}

TEST(CpuSparseDecode, PagedPrefillTokensMatchOracle) {
  DecodeConfig config{16, KvFormat::kV4Fp8, 64, 64, 16, true, false};
  config.s_q = 24;  // a prefill chunk: every token is its own row
  expect_decode_matches_oracle(config);
}

TEST(CpuSparseDecode, ZeroLengthsGiveZeroOutputAndInfiniteLse) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  testkit::DecodeCase c = testkit::make_decode_case(decode_options({6, KvFormat::kV4Fp8, 64, 40, 64, true, false}, seed));
  for_each_simd_target([&] {
    const SparseDecodeArgs args = c.args();
    for (const TensorView* lengths : {&args.main_lengths, &args.extra_lengths}) {
      for (std::int64_t t = 0; t < lengths->shape[0]; ++t) lengths->ptr<std::int32_t>()[t * lengths->stride[0]] = 0;
    }
    ASSERT_TRUE(testing::IsOk(sparse_decode(args, Backend::kCpu)));
    for (std::int64_t t = 0; t < args.out.shape[0]; ++t) {
      for (std::int64_t h = 0; h < args.out.shape[1]; ++h) {
        EXPECT_EQ(args.lse.ptr<float>()[t * args.lse.stride[0] + h * args.lse.stride[1]],
                  std::numeric_limits<float>::infinity());
        for (std::int64_t i = 0; i < args.out.shape[2]; ++i) {
          ASSERT_EQ(args.out.ptr<std::uint16_t>()[t * args.out.stride[0] + h * args.out.stride[1] + i], 0u);
        }
      }
    }
  });
}

// A case computed by hand: one head, two keys with logits 0 and log 3 after
// scaling, sink log 4: out = (1 v0 + 3 v1) / (4 + 1 + 3), lse = log(1 + 3).
TEST(CpuSparseDecode, HandComputedTwoKeyCaseWithSink) {
  constexpr std::int64_t kPage = 2;
  const int d = Bf16RowsFormat::kHeadDim;
  HostTensor pages = HostTensor::zeros(DType::kBF16, {1, kPage, d});
  HostTensor q = HostTensor::zeros(DType::kBF16, {1, 1, d});
  HostTensor indices = HostTensor::zeros(DType::kI32, {1, 3});
  HostTensor sink = HostTensor::zeros(DType::kF32, {1});
  HostTensor out = HostTensor::zeros(DType::kBF16, {1, 1, d});
  HostTensor lse = HostTensor::zeros(DType::kF32, {1, 1});
  auto* k = pages.view().ptr<std::uint16_t>();
  k[0] = f32_to_bf16(0.0f);                // key 0: logit 0, value 8 e1
  k[1] = f32_to_bf16(8.0f);
  k[d + 0] = f32_to_bf16(std::log(3.0f));  // key 1: logit log 3 (bf16-rounded), value (log 3) e0 + 8 e2
  k[d + 2] = f32_to_bf16(8.0f);
  q.view().ptr<std::uint16_t>()[0] = f32_to_bf16(1.0f);
  auto* idx = indices.view().ptr<std::int32_t>();
  idx[0] = 1;
  idx[1] = -1;  // not attended
  idx[2] = 0;
  sink.view().ptr<float>()[0] = std::log(4.0f);
  SparseDecodeArgs args;
  args.q = q.view();
  args.main_cache = {pages.view(), KvFormat::kBf16Rows};
  args.main_indices = indices.view();
  args.sink = sink.view();
  args.softmax_scale = 1.0f;
  args.out = out.view();
  args.lse = lse.view();
  ASSERT_TRUE(testing::IsOk(sparse_decode(args, Backend::kCpu)));
  const double e1 = std::exp(static_cast<double>(bf16_to_f32(f32_to_bf16(std::log(3.0f)))));  // ~3
  const double denominator = 4.0 + 1.0 + e1;
  const auto* o = out.view().ptr<std::uint16_t>();
  const double log3 = bf16_to_f32(f32_to_bf16(std::log(3.0f)));
  EXPECT_NEAR(bf16_to_f32(o[0]), e1 * log3 / denominator, 0.01);  // v1's first dim is its logit
  EXPECT_NEAR(bf16_to_f32(o[1]), 8.0 / denominator, 0.01);
  EXPECT_NEAR(bf16_to_f32(o[2]), 8.0 * e1 / denominator, 0.02);
  for (int i = 3; i < d; ++i) ASSERT_EQ(o[i], 0u) << i;
  EXPECT_NEAR(lse.view().ptr<float>()[0], std::log(1.0 + e1), 1e-5);
}

TEST(CpuSparseDecode, SameBytesForAnyThreadCount) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (int s_q : {1, 8}) {  // 2 tokens: heads split across items; 16 tokens: one item per token
    DecodeConfig config{64, KvFormat::kV4Fp8, 64, 200, 64, true, false};
    config.s_q = s_q;
    testkit::DecodeCase c = testkit::make_decode_case(decode_options(config, seed));
    std::vector<std::vector<std::byte>> results;
    for (int threads : {1, 2, 3, 5}) {
      cpu::set_num_threads(threads);
      const SparseDecodeArgs args = c.args();
      ASSERT_TRUE(testing::IsOk(sparse_decode(args, Backend::kCpu)));
      const auto* out = c.out().bytes();
      const auto* lse = c.lse().bytes();
      std::vector<std::byte> bytes(out, out + c.out().size_bytes());
      bytes.insert(bytes.end(), lse, lse + c.lse().size_bytes());
      results.push_back(std::move(bytes));
    }
    cpu::set_num_threads(0);
    for (std::size_t i = 1; i < results.size(); ++i) EXPECT_TRUE(results[i] == results[0]) << "thread run " << i;
  }
}

// The tests above run once per target listed here; the list shows in the log.
TEST(CpuSimdTargets, AtLeastOneTargetAndTheBestIsDispatched) {
  const auto targets = cpu::available_simd_targets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (const auto& target : targets) names += target.name + " ";
  std::printf("cpu SIMD targets compiled in and supported here: %s(dispatching to %s)\n", names.c_str(),
              cpu::active_simd_target().c_str());
  EXPECT_EQ(cpu::active_simd_target(), targets.front().name);
  cpu::force_simd_target(targets.back().id);
  EXPECT_EQ(cpu::active_simd_target(), targets.back().name);
  cpu::force_simd_target(0);
  EXPECT_EQ(cpu::active_simd_target(), targets.front().name);
}

TEST(CpuSparseDecode, IsTheDefaultBackendWithoutGpu) {
  EXPECT_TRUE(backend_available(Backend::kCpu));
  if (!backend_available(Backend::kCuda)) {
    EXPECT_EQ(resolve_backend(Backend::kAuto), Backend::kCpu);
  }
}

// ---------------------------------------------------------------------------

void expect_prefill_matches_oracle(std::int64_t heads, int d_qk, bool strided) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE(fmt::format("h {} d_qk {} strided {} seed {}", heads, d_qk, strided, seed));
  testkit::PrefillCaseOptions o;
  o.s_q = 6;
  o.s_kv = 160;
  o.num_heads = heads;
  o.d_qk = d_qk;
  o.topk = 72;
  o.strided = strided;
  o.seed = seed;
  ASSERT_TRUE(testing::IsOk(testkit::check_prefill_case_options(o)));
  testkit::PrefillCase c = testkit::make_prefill_case(o);
  const OracleOutputs want = oracle_prefill(c.args());
  for_each_simd_target([&] {
    const SparsePrefillArgs args = c.args();
    ASSERT_TRUE(testing::IsOk(sparse_prefill(args, Backend::kCpu)));
    EXPECT_TRUE(testkit::all_written(args.out));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_bf16(args.out, want.out.view(), kOutTolerance), "out"));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_f32(args.lse, want.lse.view(), kLseTolerance), "lse"));
    EXPECT_TRUE(testing::WithinTolerance(
        testkit::compare_f32(args.max_logits, want.max_logits.view(), kLseTolerance), "max_logits"));
  });
}

TEST(CpuSparsePrefill, MatchesFloat64Oracle) {
  expect_prefill_matches_oracle(1, 512, false);
  expect_prefill_matches_oracle(3, 576, true);
  expect_prefill_matches_oracle(64, 512, true);
  expect_prefill_matches_oracle(128, 576, false);
}

}  // namespace
}  // namespace smla
