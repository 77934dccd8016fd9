// Property test of kv_rows.h: for 1000 random rows per format, the bytes of
// encode_token equal the float64 oracle of kv_reference.h and decode_token
// returns the oracle's dequantized values. Rows mix magnitudes from 2^-40 to
// 2^100, all-zero and tiny tiles, exact 448 * 2^k values, ties, NaN and Inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "src/core/kv_rows.h"
#include "tests/common/test_common.h"
#include "tests/unit/core/kv_reference.h"

namespace smla::testing {
namespace {

constexpr int kRowsPerFormat = 1000;
constexpr std::int64_t kPageSize = 3;  // odd, so V4 scale rows start at an odd token boundary

template <class FORMAT>
class KvRowsProperty : public ::testing::Test {};
using AllFormats = ::testing::Types<V4Fp8Format, V32Fp8Format, Bf16RowsFormat, Fp8RowsFormat>;
TYPED_TEST_SUITE(KvRowsProperty, AllFormats);

std::vector<float> random_row(std::mt19937_64& rng, int head_dim) {
  constexpr int kSpan = 64;  // one V4 tile; V3.2 tiles then mix two spans
  std::uniform_int_distribution<int> kind(0, 11);
  std::uniform_int_distribution<int> log_scale(-40, 100);
  std::uniform_int_distribution<int> small_int(-16, 16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(head_dim), 0.0f);
  for (int start = 0; start < head_dim; start += kSpan) {
    const int k = kind(rng);
    const int scale_exponent = log_scale(rng);
    for (int i = start; i < start + kSpan && i < head_dim; ++i) {
      float& v = x[static_cast<std::size_t>(i)];
      switch (k) {
        case 0:
          v = 0.0f;
          break;  // all-zero tile
        case 1:
          v = normal(rng) * 1e-5f;
          break;  // amax below the 1e-4 clamp
        case 2:
          v = normal(rng) * 0.01f;
          break;  // amax below 0.0448
        case 3:
          v = std::ldexp(448.0f, small_int(rng)) * (unit(rng) < 0.5f ? -1.0f : 1.0f);
          break;
        case 4:
          v = std::ldexp(static_cast<float>(small_int(rng)) + 0.5f, small_int(rng));
          break;  // ties
        case 5:
          v = std::ldexp(normal(rng), -140);
          break;  // f32 subnormals
        default:
          v = std::ldexp(normal(rng), scale_exponent / 2);
          break;
      }
    }
  }
  // Plant non-finite values in a few rows, anywhere (NoPE or RoPE).
  std::uniform_int_distribution<int> dim(0, head_dim - 1);
  if (unit(rng) < 0.2f) x[static_cast<std::size_t>(dim(rng))] = std::numeric_limits<float>::quiet_NaN();
  if (unit(rng) < 0.2f) x[static_cast<std::size_t>(dim(rng))] = -std::numeric_limits<float>::quiet_NaN();
  if (unit(rng) < 0.2f) x[static_cast<std::size_t>(dim(rng))] = std::numeric_limits<float>::infinity();
  if (unit(rng) < 0.2f) x[static_cast<std::size_t>(dim(rng))] = -std::numeric_limits<float>::infinity();
  return x;
}

TYPED_TEST(KvRowsProperty, EncodeAndDecodeMatchFloat64Rule) {
  using Format = TypeParam;
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << Format::kName << " seed " << seed << " (SMLA_TEST_SEED overrides)");
  std::mt19937_64 rng(seed);
  const float fp8_scale = Format::kFormat == KvFormat::kFp8Rows ? 0.375f : 1.0f;
  std::vector<std::uint8_t> page(static_cast<std::size_t>(Format::page_bytes(kPageSize)), 0xA5);
  std::vector<float> decoded(Format::kHeadDim);

  for (int r = 0; r < kRowsPerFormat; ++r) {
    const std::vector<float> x = random_row(rng, Format::kHeadDim);
    const std::int64_t t = r % kPageSize;
    detail::encode_token<Format>(x.data(), page.data(), kPageSize, t, fp8_scale);
    const std::vector<std::uint8_t> want = ref_encode_record<Format>(x.data(), fp8_scale);
    for (const RecordPiece& piece : record_pieces<Format>(kPageSize, t)) {
      for (int b = 0; b < piece.length; ++b) {
        ASSERT_EQ(page[static_cast<std::size_t>(piece.page_offset + b)],
                  want[static_cast<std::size_t>(piece.record_offset + b)])
            << "row " << r << " record byte " << piece.record_offset + b;
      }
    }

    detail::decode_token<Format>(page.data(), kPageSize, t, fp8_scale, decoded.data());
    const std::vector<double> want_values = ref_decode_record<Format>(want, fp8_scale);
    for (int d = 0; d < Format::kHeadDim; ++d) {
      const double w = want_values[static_cast<std::size_t>(d)];
      const float got = decoded[static_cast<std::size_t>(d)];
      if (std::isnan(w)) {
        ASSERT_TRUE(std::isnan(got)) << "row " << r << " dim " << d;
      } else {
        ASSERT_EQ(static_cast<double>(got), w) << "row " << r << " dim " << d;
      }
    }
  }
}

}  // namespace
}  // namespace smla::testing
