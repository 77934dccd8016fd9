// Test-only builders for tiny hand-written attention cases.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "smla/attention.h"
#include "smla/numeric.h"
#include "testkit/testkit.h"

namespace smla::testing::hand {

using testkit::HostTensor;

// A cache whose every byte starts as 0xFF (NaN in every format), so a row the
// test does not write can never be read unnoticed.
inline HostTensor nan_cache(KvFormat format, std::int64_t num_pages, std::int64_t page_size) {
  const KvFormatInfo info = kv_format_info(format);
  const std::int64_t page_bytes = visit_kv_format(format, [&](auto f) { return decltype(f)::page_bytes(page_size); });
  HostTensor t =
      HostTensor::zeros(info.storage_dtype, {num_pages, page_size, info.row_elements},
                        {page_bytes / static_cast<std::int64_t>(dtype_size(info.storage_dtype)), info.row_elements, 1});
  std::memset(t.bytes(), 0xFF, t.size_bytes());
  return t;
}

inline std::uint8_t* slot_bytes(const HostTensor& cache, std::int64_t slot, std::int64_t* entry) {
  const TensorView& v = cache.view();
  *entry = slot % v.shape[1];
  return reinterpret_cast<std::uint8_t*>(cache.bytes()) +
         (slot / v.shape[1]) * v.stride[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
}

// bf16-rows cache: row `slot` = zeros except the given dims.
inline void put_bf16_row(const HostTensor& cache, std::int64_t slot, const std::map<int, float>& values) {
  std::int64_t entry = 0;
  std::uint8_t* row = slot_bytes(cache, slot, &entry) + entry * Bf16RowsFormat::kBytesPerToken;
  std::memset(row, 0, Bf16RowsFormat::kBytesPerToken);
  for (const auto& [dim, value] : values) {
    const std::uint16_t bits = f32_to_bf16(value);
    std::memcpy(row + 2 * dim, &bits, 2);
  }
}

inline HostTensor i32_matrix(const std::vector<std::vector<std::int32_t>>& rows) {
  const auto width = static_cast<std::int64_t>(rows.empty() ? 0 : rows[0].size());
  HostTensor t = HostTensor::zeros(DType::kI32, {static_cast<std::int64_t>(rows.size()), width});
  auto* p = reinterpret_cast<std::int32_t*>(t.bytes());
  for (const auto& row : rows) {
    for (std::int32_t v : row) *p++ = v;
  }
  return t;
}

inline HostTensor i32_vector(const std::vector<std::int32_t>& values) {
  HostTensor t = HostTensor::zeros(DType::kI32, {static_cast<std::int64_t>(values.size())});
  std::memcpy(t.bytes(), values.data(), values.size() * sizeof(std::int32_t));
  return t;
}

inline HostTensor f32_vector(const std::vector<float>& values) {
  HostTensor t = HostTensor::zeros(DType::kF32, {static_cast<std::int64_t>(values.size())});
  std::memcpy(t.bytes(), values.data(), values.size() * sizeof(float));
  return t;
}

// q [T, H, d] zeros except the given (t, h, d) entries.
inline HostTensor q_tensor(std::int64_t T, std::int64_t H, std::int64_t d,
                           const std::map<std::vector<std::int64_t>, float>& values) {
  HostTensor t = HostTensor::zeros(DType::kBF16, {T, H, d});
  for (const auto& [index, value] : values) {
    t.view().ptr<std::uint16_t>()[(index[0] * H + index[1]) * d + index[2]] = f32_to_bf16(value);
  }
  return t;
}

inline float out_at(const TensorView& out, std::int64_t t, std::int64_t h, std::int64_t d) {
  return bf16_to_f32(out.ptr<const std::uint16_t>()[t * out.stride[0] + h * out.stride[1] + d * out.stride[2]]);
}
inline float f32_at(const TensorView& v, std::int64_t t, std::int64_t h) {
  return v.ptr<const float>()[t * v.stride[0] + h * v.stride[1]];
}

// Tolerance for a bf16-rounded output against its exact value.
inline double bf16_tol(double want) { return std::abs(want) / 256.0 + 1e-7; }

// A flat bf16 prefill over four kv rows, built by hand:
// r0 = e0, r1 = 2 e1, r2 = -e0 + e2, r3 = NaN in every dim (never selected unless a test says so).
// q = a e0 + b e1 (one token, one head). args() poisons the outputs and returns the call.
struct FourRowPrefill {
  static constexpr int kDim = 512;
  HostTensor kv = HostTensor::zeros(DType::kBF16, {4, kDim});
  HostTensor q;
  HostTensor out = HostTensor::zeros(DType::kBF16, {1, 1, kDim});
  HostTensor max_logits = HostTensor::zeros(DType::kF32, {1, 1});
  HostTensor lse = HostTensor::zeros(DType::kF32, {1, 1});
  HostTensor indices, topk_length, sink;
  float softmax_scale = 0.5f;

  FourRowPrefill(float a, float b) : q(q_tensor(1, 1, kDim, {{{0, 0, 0}, a}, {{0, 0, 1}, b}})) {
    auto* p = kv.view().ptr<std::uint16_t>();
    p[0] = f32_to_bf16(1.0f);
    p[kDim + 1] = f32_to_bf16(2.0f);
    p[2 * kDim] = f32_to_bf16(-1.0f);
    p[2 * kDim + 2] = f32_to_bf16(1.0f);
    for (int d = 0; d < kDim; ++d) p[3 * kDim + d] = 0x7FC0;
  }
  SparsePrefillArgs args() {
    testkit::poison(out.view());
    testkit::poison(max_logits.view());
    testkit::poison(lse.view());
    SparsePrefillArgs a;
    a.q = q.view();
    a.kv = kv.view();
    a.indices = indices.view();
    a.topk_length = topk_length.view();
    a.sink = sink.view();
    a.softmax_scale = softmax_scale;
    a.out = out.view();
    a.max_logits = max_logits.view();
    a.lse = lse.view();
    return a;
  }
};

}  // namespace smla::testing::hand
