#include <gtest/gtest.h>

#include <cmath>

#include "smla/codec.h"
#include "smla/compressor.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/compressor_rig.h"

namespace smla {
namespace {

using layer_test::Buffer;
using layer_test::CompressorRig;
using layer_test::token_range;
using testing::FailsWith;
using testing::IsOk;

// Reads a bf16-rows entry of the rig's cache.
std::vector<float> bf16_entry(const CompressorRig& rig, std::int64_t slot) {
  const auto* page = reinterpret_cast<const std::uint16_t*>(rig.kv_cache->bytes.data()) +
                     (slot / rig.page_size) * rig.kv_cache->view.pages.stride[0];
  std::vector<float> row(512);
  for (int i = 0; i < 512; ++i) row[static_cast<std::size_t>(i)] = bf16_to_f32(page[(slot % rig.page_size) * 512 + i]);
  return row;
}

// normed = pooled * rsqrt(mean(pooled^2) + eps) * weight, in double.
std::vector<double> rms_normed(const std::vector<double>& pooled, const std::vector<float>& weight) {
  double mean_square = 0;
  for (double v : pooled) mean_square += v * v;
  mean_square /= static_cast<double>(pooled.size());
  std::vector<double> out(pooled.size());
  for (std::size_t c = 0; c < pooled.size(); ++c) out[c] = pooled[c] / std::sqrt(mean_square + 1e-6) * weight[c];
  return out;
}

void expect_bf16_close(const std::vector<float>& got, const std::vector<double>& want, int dims, const char* what) {
  for (int c = 0; c < dims; ++c) {
    ASSERT_NEAR(got[static_cast<std::size_t>(c)], want[static_cast<std::size_t>(c)],
                std::fabs(want[static_cast<std::size_t>(c)]) * 8e-3 + 1e-6)
        << what << " channel " << c;
  }
}

class CompressorHandTest : public ::testing::TestWithParam<Backend> {};

// r = 4 at positions 3 and 7. At 3 the previous window lies at negative
// positions (masked), so uniform scores average the second halves of rows
// 0..3. At 7, scores of +-50 make even channels pick row 1's first half (the
// previous window) and odd channels row 6's second half.
TEST_P(CompressorHandTest, RatioFourWindowsAtPositionsThreeAndSeven) {
  std::mt19937_64 rng(7);
  auto table = RopeTable::create(RopeConfig::compressed(), 64);
  ASSERT_TRUE(IsOk(table.status()));
  CompressorRig rig(4, false, KvFormat::kBf16Rows, 1, 8, 3, &*table, rng);
  std::fill(rig.ape.data.begin(), rig.ape.data.end(), 0.0f);
  const int d = 512;
  for (int pos = 0; pos < 8; ++pos) {
    float* row = rig.projection(0, pos);  // [kv first | kv second | score first | score second]
    for (int c = 0; c < d; ++c) {
      row[2 * d + c] = (pos == 1 && c % 2 == 0) ? 50.0f : -50.0f;
      row[3 * d + c] = pos < 4 ? 0.0f : ((pos == 6 && c % 2 == 1) ? 50.0f : -50.0f);
    }
  }
  ASSERT_TRUE(IsOk(rig.run(token_range(0, 0, 8), GetParam())));

  std::vector<double> mean(d, 0.0);
  for (int pos = 0; pos < 4; ++pos) {
    for (int c = 0; c < d; ++c) mean[static_cast<std::size_t>(c)] += rig.projection(0, pos)[d + c] / 4.0;
  }
  // Entry 0 is rotated at position 0, i.e. not at all.
  expect_bf16_close(bf16_entry(rig, rig.entry_slot(0, 0)), rms_normed(mean, rig.norm.data), d, "entry 0");

  std::vector<double> picked(d);
  for (int c = 0; c < d; ++c) {
    picked[static_cast<std::size_t>(c)] = c % 2 == 0 ? rig.projection(0, 1)[c] : rig.projection(0, 6)[d + c];
  }
  const auto want = rms_normed(picked, rig.norm.data);
  const auto got = bf16_entry(rig, rig.entry_slot(0, 1));
  expect_bf16_close(got, want, 448, "entry 1 NoPE");
  // Entry 1 is rotated at position 4; pair 0 has inverse frequency 1: angle 4 rad.
  EXPECT_NEAR(got[448], want[448] * std::cos(4.0) - want[449] * std::sin(4.0), 2e-2);
  EXPECT_NEAR(got[449], want[448] * std::sin(4.0) + want[449] * std::cos(4.0), 2e-2);
}

// r = 128: entries close at positions 127 and 255; uniform scores average the
// 128 rows of each window (no overlap: kv is the first d values of a row).
TEST_P(CompressorHandTest, RatioOneTwentyEightAtPositions127And255) {
  std::mt19937_64 rng(11);
  auto table = RopeTable::create(RopeConfig::compressed(), 512);
  ASSERT_TRUE(IsOk(table.status()));
  CompressorRig rig(128, false, KvFormat::kBf16Rows, 1, 260, 2, &*table, rng);
  const int d = 512;
  for (int pos = 0; pos < 260; ++pos) std::fill_n(rig.projection(0, pos) + d, d, 0.25f);
  std::fill(rig.ape.data.begin(), rig.ape.data.end(), 0.5f);
  const auto untouched = rig.dest_bytes();
  ASSERT_TRUE(IsOk(rig.run(token_range(0, 0, 127), GetParam())));
  EXPECT_EQ(rig.dest_bytes(), untouched);  // nothing closes before position 127
  ASSERT_TRUE(IsOk(rig.run(token_range(0, 127, 260), GetParam())));
  for (int entry = 0; entry < 2; ++entry) {
    std::vector<double> mean(d, 0.0);
    for (int pos = entry * 128; pos < entry * 128 + 128; ++pos) {
      for (int c = 0; c < d; ++c) mean[static_cast<std::size_t>(c)] += rig.projection(0, pos)[c] / 128.0;
    }
    expect_bf16_close(bf16_entry(rig, rig.entry_slot(0, entry)), rms_normed(mean, rig.norm.data), 448,
                      entry == 0 ? "entry 0" : "entry 1");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CompressorHandTest, ::testing::Values(Backend::kCpu, Backend::kReference),
                         [](const auto& param_info) { return std::string(backend_name(param_info.param)); });

struct Variant {
  int ratio;
  bool indexer;
  KvFormat format;
  int length;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << "r" << v.ratio << (v.indexer ? " indexer " : " main ") << kv_format_name(v.format) << " len " << v.length;
}

class CompressorVariantTest : public ::testing::TestWithParam<Variant> {};

// Chunked prefill split at every point leaves byte-identical caches.
TEST_P(CompressorVariantTest, EverySplitMatchesOneWholePrefill) {
  const auto v = GetParam();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 1024);
  ASSERT_TRUE(IsOk(table.status()));
  std::mt19937_64 rng(seed);
  CompressorRig whole(v.ratio, v.indexer, v.format, 1, v.length, 5, &*table, rng);
  ASSERT_TRUE(IsOk(whole.run(token_range(0, 0, v.length), Backend::kCpu)));
  const int step = v.length > 64 ? 7 : 1;  // r = 128: every 7th split keeps the test fast
  for (int split = 1; split < v.length; split += step) {
    std::mt19937_64 same(seed);
    CompressorRig chunked(v.ratio, v.indexer, v.format, 1, v.length, 5, &*table, same);
    ASSERT_TRUE(IsOk(chunked.run(token_range(0, 0, split), Backend::kCpu)));
    ASSERT_TRUE(IsOk(chunked.run(token_range(0, split, v.length), Backend::kCpu)));
    ASSERT_EQ(chunked.dest_bytes(), whole.dest_bytes()) << "split at " << split;
    ASSERT_EQ(0, std::memcmp(chunked.state.data.data(), whole.state.data.data(), whole.state.data.size() * 4))
        << "state, split at " << split;
  }
}

// Two requests interleaved in one step give the bytes of two separate steps:
// windows never cross a request boundary.
TEST_P(CompressorVariantTest, RequestsDoNotMix) {
  const auto v = GetParam();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 1024);
  ASSERT_TRUE(IsOk(table.status()));
  std::mt19937_64 rng_a(seed), rng_b(seed);
  CompressorRig mixed(v.ratio, v.indexer, v.format, 2, v.length, 3, &*table, rng_a);
  CompressorRig separate(v.ratio, v.indexer, v.format, 2, v.length, 3, &*table, rng_b);
  std::vector<std::pair<int, std::int64_t>> interleaved;
  for (std::int64_t p = 0; p < v.length; ++p) {
    interleaved.emplace_back(1, p);
    interleaved.emplace_back(0, p);
  }
  ASSERT_TRUE(IsOk(mixed.run(interleaved, Backend::kCpu)));
  ASSERT_TRUE(IsOk(separate.run(token_range(0, 0, v.length), Backend::kCpu)));
  ASSERT_TRUE(IsOk(separate.run(token_range(1, 0, v.length), Backend::kCpu)));
  EXPECT_EQ(mixed.dest_bytes(), separate.dest_bytes());
}

// The f32 path against the float64 reference, through the cache decoders.
TEST_P(CompressorVariantTest, CpuMatchesReference) {
  const auto v = GetParam();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 1024);
  ASSERT_TRUE(IsOk(table.status()));
  std::mt19937_64 rng_a(seed), rng_b(seed);
  CompressorRig cpu(v.ratio, v.indexer, v.format, 2, v.length, 3, &*table, rng_a);
  CompressorRig ref(v.ratio, v.indexer, v.format, 2, v.length, 3, &*table, rng_b);
  auto tokens = token_range(0, 0, v.length);
  for (auto t : token_range(1, 0, v.length / 2)) tokens.push_back(t);
  ASSERT_TRUE(IsOk(cpu.run(tokens, Backend::kCpu)));
  ASSERT_TRUE(IsOk(ref.run(tokens, Backend::kReference)));
  const int d = cpu.head_dim;
  std::vector<float> a(static_cast<std::size_t>(d)), b(static_cast<std::size_t>(d));
  int compared = 0;
  for (int req = 0; req < 2; ++req) {
    const int entries = (req == 0 ? v.length : v.length / 2) / v.ratio;
    for (int e = 0; e < entries; ++e) {
      const std::int64_t slot = cpu.entry_slot(req, e);
      if (v.indexer) {
        decode_indexer_key(cpu.index_cache->view, slot, a.data());
        decode_indexer_key(ref.index_cache->view, slot, b.data());
      } else {
        Buffer<std::int64_t> s(DType::kI64, {1}, slot);
        Buffer<float> ra(DType::kF32, {1, 512}), rb(DType::kF32, {1, 512});
        ASSERT_TRUE(IsOk(gather_from_cache(cpu.kv_cache->view, s.view, ra.view)));
        ASSERT_TRUE(IsOk(gather_from_cache(ref.kv_cache->view, s.view, rb.view)));
        a = ra.data;
        b = rb.data;
      }
      for (int c = 0; c < d; ++c) {
        const float want = b[static_cast<std::size_t>(c)];
        ASSERT_NEAR(a[static_cast<std::size_t>(c)], want, 0.07f * std::max(1.0f, std::fabs(want)))
            << "request " << req << " entry " << e << " channel " << c;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CompressorVariantTest,
                         ::testing::Values(Variant{4, false, KvFormat::kV4Fp8, 19},
                                           Variant{4, false, KvFormat::kBf16Rows, 13},
                                           Variant{128, false, KvFormat::kV4Fp8, 259},
                                           Variant{4, true, KvFormat::kV4Fp8, 21}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.indexer ? "indexer" : "main") + "_r" +
                                  std::to_string(param_info.param.ratio) + "_" +
                                  (param_info.param.format == KvFormat::kV4Fp8 ? "fp8" : "bf16");
                         });

TEST(CompressorValidationTest, RejectsBadIndicesAndWritesNothing) {
  std::mt19937_64 rng(3);
  auto table = RopeTable::create(RopeConfig::compressed(), 64);
  ASSERT_TRUE(IsOk(table.status()));
  CompressorRig rig(4, false, KvFormat::kV4Fp8, 1, 12, 3, &*table, rng);
  const auto dest = rig.dest_bytes();
  const auto state = rig.state.data;
  // A state block id out of range.
  rig.state_table.data[1] = 99;
  EXPECT_TRUE(FailsWith(rig.run(token_range(0, 0, 8), Backend::kCpu), StatusCode::kOutOfRange,
                        {"state_block_table[0][1]", "99"}));
  rig.state_table.data[1] = 1;
  // A position beyond the table's columns.
  rig.state_table.view.shape[1] = 2;
  EXPECT_TRUE(FailsWith(rig.run(token_range(0, 8, 9), Backend::kCpu), StatusCode::kOutOfRange,
                        {"state_block_table[0]", "2 columns"}));
  rig.state_table.view.shape[1] = 3;
  EXPECT_EQ(rig.dest_bytes(), dest);
  EXPECT_EQ(0, std::memcmp(rig.state.data.data(), state.data(), state.size() * 4));
  // Host tensors on cuda: no cuda context here (not built, no device), or an error naming the tensor.
  EXPECT_FALSE(rig.run(token_range(0, 0, 4), Backend::kCuda).ok());
}

}  // namespace
}  // namespace smla
