// An independent, float64 statement of the KV quantization rules (spec 2.2 -
// 2.4) used as the oracle for the codec tests. It shares no code with
// numeric.h or kv_rows.h: roundings are done by search or by frexp/rint on
// doubles, so a bug in the production bit tricks cannot hide in both places.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "smla/kv_format.h"

namespace smla::testing {

// Value of an OCP e4m3 code, from the format definition: bias 7, 3 mantissa
// bits, exponent field 0 is subnormal (M * 2^-9), S.1111.111 is NaN.
inline double ref_e4m3_value(int code) {
  const int sign = (code >> 7) & 1;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 7;
  if (exponent == 0xF && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude =
      exponent == 0 ? mantissa * std::ldexp(1.0, -9) : (1.0 + mantissa / 8.0) * std::ldexp(1.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// Nearest e4m3 code: the two finite codes around |x| (codes 0..0x7E are
// increasing in value), ties to the even code (the code's low bit is the
// mantissa's low bit); beyond 448 (and +-Inf) saturates to +-448; NaN keeps
// its sign.
inline std::uint8_t ref_e4m3_code(double x) {
  static const std::vector<double> kMagnitudes = [] {
    std::vector<double> values;
    for (int code = 0; code <= 0x7E; ++code) values.push_back(ref_e4m3_value(code));
    return values;
  }();
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const double magnitude = std::fabs(x);
  if (magnitude >= 448.0) return sign | 0x7E;
  const auto above = std::lower_bound(kMagnitudes.begin(), kMagnitudes.end(), magnitude);
  int code = static_cast<int>(above - kMagnitudes.begin());  // first code >= magnitude
  if (code > 0) {
    const double up = kMagnitudes[static_cast<std::size_t>(code)] - magnitude;
    const double down = magnitude - kMagnitudes[static_cast<std::size_t>(code - 1)];
    if (down < up || (down == up && (code - 1) % 2 == 0)) code -= 1;
  }
  return static_cast<std::uint8_t>(sign | code);
}

// bf16 rounding (8 significant bits, ties to even, overflow to Inf), on doubles.
inline double ref_bf16(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int k = 0;
  std::frexp(std::fabs(x), &k);  // |x| = m * 2^k, m in [0.5, 1)
  // Normal bf16 keeps 8 significant bits; below 2^-126 the step is fixed at 2^-133.
  const int step_exponent = k - 1 >= -126 ? k - 8 : -133;
  const double steps = std::nearbyint(std::ldexp(std::fabs(x), -step_exponent));
  const double rounded = std::ldexp(steps, step_exponent);
  const double largest = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
  const double magnitude = rounded > largest ? std::numeric_limits<double>::infinity() : rounded;
  return std::signbit(x) ? -magnitude : magnitude;
}

inline std::uint16_t ref_bf16_bits(double x) {
  const float f = static_cast<float>(ref_bf16(x));  // exact: a bf16 value is an f32 value
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(x)) u = (u & 0x80000000u) | 0x7FC00000u;
  return static_cast<std::uint16_t>(u >> 16);
}

// Tile exponent of the production rule: e = ceil(log2(max(amax, 1e-4) / 448))
// over the finite bf16-rounded values of the tile.
inline int ref_tile_exponent(const double* bf16_values, int count) {
  double amax = 0.0;
  for (int i = 0; i < count; ++i) {
    if (std::isfinite(bf16_values[i])) amax = std::fmax(amax, std::fabs(bf16_values[i]));
  }
  return static_cast<int>(std::ceil(std::log2(std::fmax(amax, 1e-4) / 448.0)));
}

// Where the scales and the RoPE values sit inside one token record: V4 keeps
// [NoPE e4m3 | RoPE bf16] then [scales | pad]; V3.2 [NoPE | scales | RoPE].
template <class FORMAT>
constexpr int record_scale_offset() {
  if constexpr (FORMAT::kFormat == KvFormat::kV4Fp8) {
    return FORMAT::kDataBytes;
  } else {
    return FORMAT::kNopeDim;
  }
}
template <class FORMAT>
constexpr int record_rope_offset() {
  if constexpr (FORMAT::kFormat == KvFormat::kV4Fp8) {
    return FORMAT::kNopeDim;
  } else {
    return FORMAT::kNopeDim + FORMAT::kScaleBytes;
  }
}

// One token record as the format stores it (bytes_per_token bytes, fields in
// the order of the format's byte map; V4 data first, then its 8 scale bytes).
// fp8-rows uses e4m3(bf16(x) / scale) with the division done in f32, as the
// production writer does.
template <class FORMAT>
std::vector<std::uint8_t> ref_encode_record(const float* row, float fp8_scale = 1.0f) {
  std::vector<std::uint8_t> record(FORMAT::kBytesPerToken, 0);
  if constexpr (FORMAT::kFormat == KvFormat::kV4Fp8 || FORMAT::kFormat == KvFormat::kV32Fp8) {
    constexpr bool kV4 = FORMAT::kFormat == KvFormat::kV4Fp8;
    const int rope_at = record_rope_offset<FORMAT>();
    const int scale_at = record_scale_offset<FORMAT>();
    for (int tile = 0; tile < FORMAT::kNumTiles; ++tile) {
      std::vector<double> values(FORMAT::kTile);
      for (int i = 0; i < FORMAT::kTile; ++i) values[i] = ref_bf16(row[tile * FORMAT::kTile + i]);
      const int e = ref_tile_exponent(values.data(), FORMAT::kTile);
      for (int i = 0; i < FORMAT::kTile; ++i) {
        record[tile * FORMAT::kTile + i] = ref_e4m3_code(std::ldexp(values[i], -e));
      }
      if constexpr (kV4) {
        record[scale_at + tile] = static_cast<std::uint8_t>(e + 127);
      } else {
        const float scale = static_cast<float>(std::ldexp(1.0, e));
        std::memcpy(&record[scale_at + 4 * tile], &scale, 4);
      }
    }
    for (int i = 0; i < FORMAT::kRopeDim; ++i) {
      const std::uint16_t bits = ref_bf16_bits(row[FORMAT::kNopeDim + i]);
      record[rope_at + 2 * i] = static_cast<std::uint8_t>(bits & 0xFF);
      record[rope_at + 2 * i + 1] = static_cast<std::uint8_t>(bits >> 8);
    }
  } else if constexpr (FORMAT::kFormat == KvFormat::kBf16Rows) {
    for (int i = 0; i < FORMAT::kHeadDim; ++i) {
      const std::uint16_t bits = ref_bf16_bits(row[i]);
      record[2 * i] = static_cast<std::uint8_t>(bits & 0xFF);
      record[2 * i + 1] = static_cast<std::uint8_t>(bits >> 8);
    }
  } else {
    for (int i = 0; i < FORMAT::kHeadDim; ++i) {
      const float quotient = static_cast<float>(ref_bf16(row[i])) / fp8_scale;
      record[i] = ref_e4m3_code(quotient);
    }
  }
  return record;
}

// Dequantized values (head_dim of the format) of a record laid out as
// ref_encode_record returns it: e4m3 * 2^(byte - 127) (V4), e4m3 * f32 scale
// (V3.2), bf16 bits, or e4m3 * fp8_scale.
template <class FORMAT>
std::vector<double> ref_decode_record(const std::vector<std::uint8_t>& record, float fp8_scale = 1.0f) {
  std::vector<double> values(FORMAT::kHeadDim);
  const auto bf16_at = [&](int byte) {
    const std::uint32_t bits =
        static_cast<std::uint32_t>(record[byte]) << 16 | static_cast<std::uint32_t>(record[byte + 1]) << 24;
    float f;
    std::memcpy(&f, &bits, 4);
    return static_cast<double>(f);
  };
  if constexpr (FORMAT::kFormat == KvFormat::kV4Fp8 || FORMAT::kFormat == KvFormat::kV32Fp8) {
    constexpr bool kV4 = FORMAT::kFormat == KvFormat::kV4Fp8;
    const int rope_at = record_rope_offset<FORMAT>();
    const int scale_at = record_scale_offset<FORMAT>();
    for (int i = 0; i < FORMAT::kNopeDim; ++i) {
      const int tile = i / FORMAT::kTile;
      double scale;
      if constexpr (kV4) {
        scale = std::ldexp(1.0, record[scale_at + tile] - 127);
      } else {
        float f;
        std::memcpy(&f, &record[scale_at + 4 * tile], 4);
        scale = f;
      }
      values[i] = ref_e4m3_value(record[i]) * scale;
    }
    for (int i = 0; i < FORMAT::kRopeDim; ++i) values[FORMAT::kNopeDim + i] = bf16_at(rope_at + 2 * i);
  } else if constexpr (FORMAT::kFormat == KvFormat::kBf16Rows) {
    for (int i = 0; i < FORMAT::kHeadDim; ++i) values[i] = bf16_at(2 * i);
  } else {
    for (int i = 0; i < FORMAT::kHeadDim; ++i) values[i] = ref_e4m3_value(record[i]) * fp8_scale;
  }
  return values;
}

// Byte offsets of token t's record pieces inside a page, for comparing a page
// against ref_encode_record (V4 splits a token into a data row and a scale row).
struct RecordPiece {
  std::int64_t page_offset;
  int record_offset;
  int length;
};

template <class FORMAT>
std::vector<RecordPiece> record_pieces(std::int64_t page_size, std::int64_t t) {
  if constexpr (FORMAT::kFormat == KvFormat::kV4Fp8) {
    return {{t * FORMAT::kDataBytes, 0, FORMAT::kDataBytes},
            {page_size * FORMAT::kDataBytes + t * FORMAT::kScaleBytes, FORMAT::kDataBytes, FORMAT::kScaleBytes}};
  } else {
    return {{t * FORMAT::kBytesPerToken, 0, FORMAT::kBytesPerToken}};
  }
}

}  // namespace smla::testing
