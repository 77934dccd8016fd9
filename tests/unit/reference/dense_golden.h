// Test-only float64 golden for sparse attention, independent of the code
// under test: its own bit-level decoders of every KV format (reading only
// the layout constants of kv_format.h) and plain dense loops.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "smla/attention.h"
#include "testkit/host_tensor.h"

namespace smla::testing::golden {

inline double bf16_value(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// OCP e4m3fn: bias 7, no infinities, S.1111.111 is NaN, subnormals m * 2^-9.
inline double e4m3_value(std::uint8_t code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa, -9);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

inline double ue8m0_value(std::uint8_t b) {
  return b == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, b - 127);
}

inline std::uint16_t read_u16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

// Dequantizes global slot `slot` of a cache into head_dim doubles.
inline std::vector<double> decode_slot(const KvCacheView& cache, std::int64_t slot) {
  const std::int64_t page_size = cache.pages.shape[1];
  const auto* page =
      static_cast<const std::uint8_t*>(cache.pages.data) +
      (slot / page_size) * cache.pages.stride[0] * static_cast<std::int64_t>(dtype_size(cache.pages.dtype));
  const std::int64_t t = slot % page_size;
  std::vector<double> row;
  switch (cache.format) {
    case KvFormat::kV4Fp8: {
      using F = V4Fp8Format;
      const std::uint8_t* nope = page + t * F::kDataBytes;
      const std::uint8_t* scales = page + page_size * F::kDataBytes + t * F::kScaleBytes;
      for (int i = 0; i < F::kNopeDim; ++i) row.push_back(e4m3_value(nope[i]) * ue8m0_value(scales[i / F::kTile]));
      for (int i = 0; i < F::kRopeDim; ++i) row.push_back(bf16_value(read_u16(nope + F::kNopeDim + 2 * i)));
      break;
    }
    case KvFormat::kV32Fp8: {
      using F = V32Fp8Format;
      const std::uint8_t* token = page + t * F::kBytesPerToken;
      for (int i = 0; i < F::kNopeDim; ++i) {
        float scale;
        std::memcpy(&scale, token + F::kNopeDim + 4 * (i / F::kTile), 4);
        row.push_back(e4m3_value(token[i]) * scale);
      }
      for (int i = 0; i < F::kRopeDim; ++i) {
        row.push_back(bf16_value(read_u16(token + F::kNopeDim + F::kScaleBytes + 2 * i)));
      }
      break;
    }
    case KvFormat::kBf16Rows: {
      const std::uint8_t* token = page + t * Bf16RowsFormat::kBytesPerToken;
      for (int i = 0; i < Bf16RowsFormat::kHeadDim; ++i) row.push_back(bf16_value(read_u16(token + 2 * i)));
      break;
    }
    case KvFormat::kFp8Rows: {
      const std::uint8_t* token = page + t * Fp8RowsFormat::kBytesPerToken;
      for (int i = 0; i < Fp8RowsFormat::kHeadDim; ++i) {
        row.push_back(e4m3_value(token[i]) * static_cast<double>(cache.fp8_scale));
      }
      break;
    }
  }
  return row;
}

struct Result {
  std::vector<double> out;  // [T][H][d_v]
  std::vector<double> lse;  // [T][H]
  std::vector<double> max_logit;
  std::int64_t num_heads = 0;
  int d_v = 0;
  double at(std::int64_t t, std::int64_t h, int d) const {
    return out[static_cast<std::size_t>((t * num_heads + h) * d_v + d)];
  }
};

// Dense softmax over explicit rows, written out plainly.
inline void attend(const std::vector<double>& q, const std::vector<std::vector<double>>& rows, int d_v, double scale,
                   double sink, double* out, double* lse, double* max_logit) {
  const double inf = std::numeric_limits<double>::infinity();
  for (int d = 0; d < d_v; ++d) out[d] = 0.0;
  if (rows.empty()) {
    *lse = inf;
    *max_logit = -inf;
    return;
  }
  std::vector<double> logits;
  for (const auto& k : rows) {
    double s = 0.0;
    for (std::size_t d = 0; d < q.size(); ++d) s += q[d] * k[d];
    logits.push_back(scale * s);
  }
  double m = -inf;
  for (double s : logits) m = std::max(m, s);
  double sum = 0.0;
  for (double s : logits) sum += std::exp(s - m);
  *lse = m + std::log(sum);
  *max_logit = m;
  const double denominator = sink == inf ? inf : sum + std::exp(sink - m);
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const double p = std::exp(logits[j] - m) / denominator;
    for (int d = 0; d < d_v; ++d) out[d] += p * rows[j][static_cast<std::size_t>(d)];
  }
}

inline std::int32_t read_i32(const TensorView& t, std::int64_t i, std::int64_t j) {
  return t.ptr<const std::int32_t>()[i * t.stride[0] + j * t.stride[1]];
}

inline std::vector<double> read_q(const TensorView& q, std::int64_t t, std::int64_t h) {
  std::vector<double> v;
  for (std::int64_t d = 0; d < q.shape[2]; ++d) {
    v.push_back(bf16_value(q.ptr<const std::uint16_t>()[t * q.stride[0] + h * q.stride[1] + d * q.stride[2]]));
  }
  return v;
}

inline double read_sink(const TensorView& sink, std::int64_t h) {
  return sink.present() ? sink.ptr<const float>()[h * sink.stride[0]] : -std::numeric_limits<double>::infinity();
}

inline void collect(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths, std::int64_t t,
                    std::vector<std::vector<double>>& rows) {
  const std::int64_t width = indices.shape[1];
  const std::int64_t length = lengths.present() ? lengths.ptr<const std::int32_t>()[t * lengths.stride[0]] : width;
  const std::int64_t num_slots = cache.pages.shape[0] * cache.pages.shape[1];
  for (std::int64_t k = 0; k < length; ++k) {
    const std::int64_t slot = read_i32(indices, t, k);
    if (slot >= 0 && slot < num_slots) rows.push_back(decode_slot(cache, slot));
  }
}

inline Result decode(const SparseDecodeArgs& a) {
  Result r;
  const std::int64_t T = a.q.shape[0];
  r.num_heads = a.q.shape[1];
  r.d_v = static_cast<int>(a.out.shape[2]);
  r.out.resize(static_cast<std::size_t>(T * r.num_heads * r.d_v));
  r.lse.resize(static_cast<std::size_t>(T * r.num_heads));
  r.max_logit.resize(r.lse.size());
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<std::vector<double>> rows;
    collect(a.main_cache, a.main_indices, a.main_lengths, t, rows);
    if (a.extra_cache) collect(*a.extra_cache, a.extra_indices, a.extra_lengths, t, rows);
    for (std::int64_t h = 0; h < r.num_heads; ++h) {
      const auto i = static_cast<std::size_t>(t * r.num_heads + h);
      attend(read_q(a.q, t, h), rows, r.d_v, a.softmax_scale, read_sink(a.sink, h),
             &r.out[i * static_cast<std::size_t>(r.d_v)], &r.lse[i], &r.max_logit[i]);
    }
  }
  return r;
}

inline Result prefill(const SparsePrefillArgs& a) {
  Result r;
  const std::int64_t S = a.q.shape[0];
  r.num_heads = a.q.shape[1];
  r.d_v = a.d_v;
  r.out.resize(static_cast<std::size_t>(S * r.num_heads * r.d_v));
  r.lse.resize(static_cast<std::size_t>(S * r.num_heads));
  r.max_logit.resize(r.lse.size());
  for (std::int64_t s = 0; s < S; ++s) {
    std::vector<std::vector<double>> rows;
    const std::int64_t width = a.indices.shape[1];
    const std::int64_t length =
        a.topk_length.present() ? a.topk_length.ptr<const std::int32_t>()[s * a.topk_length.stride[0]] : width;
    for (std::int64_t k = 0; k < length; ++k) {
      const std::int64_t i = read_i32(a.indices, s, k);
      if (i < 0 || i >= a.kv.shape[0]) continue;
      std::vector<double> row;
      for (std::int64_t d = 0; d < a.kv.shape[1]; ++d) {
        row.push_back(bf16_value(a.kv.ptr<const std::uint16_t>()[i * a.kv.stride[0] + d * a.kv.stride[1]]));
      }
      rows.push_back(std::move(row));
    }
    for (std::int64_t h = 0; h < r.num_heads; ++h) {
      const auto i = static_cast<std::size_t>(s * r.num_heads + h);
      attend(read_q(a.q, s, h), rows, r.d_v, a.softmax_scale, read_sink(a.sink, h),
             &r.out[i * static_cast<std::size_t>(r.d_v)], &r.lse[i], &r.max_logit[i]);
    }
  }
  return r;
}

// The golden result as tensors shaped like the op's outputs (out rounded to bf16).
inline testkit::HostTensor out_tensor(const Result& r, std::int64_t T) {
  testkit::HostTensor t = testkit::HostTensor::zeros(DType::kBF16, {T, r.num_heads, r.d_v});
  auto* p = reinterpret_cast<std::uint16_t*>(t.bytes());
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    // Round-to-nearest-even of the float64 value through float (exact for bf16 targets away from ties).
    const float f = static_cast<float>(r.out[i]);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    p[i] = static_cast<std::uint16_t>(u >> 16);
  }
  return t;
}

inline testkit::HostTensor f32_tensor(const std::vector<double>& values, std::int64_t T, std::int64_t H) {
  testkit::HostTensor t = testkit::HostTensor::zeros(DType::kF32, {T, H});
  auto* p = reinterpret_cast<float*>(t.bytes());
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = static_cast<float>(values[i]);
  return t;
}

}  // namespace smla::testing::golden
