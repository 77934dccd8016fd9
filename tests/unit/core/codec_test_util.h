// Test-only owners for paged caches and row tensors used by the codec tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "smla/tensor.h"
#include "tests/unit/core/kv_reference.h"

namespace smla::testing {

// Every byte the codec must not touch starts as this value.
inline constexpr std::uint8_t kCanary = 0xA5;
// Bytes of canary after the last page, to catch writes past the end.
inline constexpr std::int64_t kTailBytes = 64;

// A cache of num_pages pages whose stride (in bytes) may exceed the content,
// leaving canary bytes between pages.
struct PagedCache {
  std::vector<std::uint8_t> bytes;
  std::int64_t page_stride_bytes = 0;
  KvCacheView view;

  PagedCache(KvFormat format, std::int64_t num_pages, std::int64_t page_size, std::int64_t stride_bytes,
             float fp8_scale = 1.0f)
      : bytes(static_cast<std::size_t>(num_pages * stride_bytes + kTailBytes), kCanary),
        page_stride_bytes(stride_bytes) {
    const KvFormatInfo info = kv_format_info(format);
    const auto element = static_cast<std::int64_t>(dtype_size(info.storage_dtype));
    view.pages = TensorView::strided(bytes.data(), info.storage_dtype, {num_pages, page_size, info.row_elements},
                                     {stride_bytes / element, info.row_elements, 1});
    view.format = format;
    view.fp8_scale = fp8_scale;
  }
  std::int64_t page_size() const { return view.page_size(); }
};

// Writes ref_encode_record(row) for `slot` into a byte image of the cache.
template <class FORMAT>
void place_reference_record(std::vector<std::uint8_t>& image, const PagedCache& cache, std::int64_t slot,
                            const std::vector<std::uint8_t>& record) {
  const std::int64_t page = slot / cache.page_size();
  const std::int64_t entry = slot % cache.page_size();
  for (const RecordPiece& piece : record_pieces<FORMAT>(cache.page_size(), entry)) {
    std::memcpy(&image[static_cast<std::size_t>(page * cache.page_stride_bytes + piece.page_offset)],
                &record[static_cast<std::size_t>(piece.record_offset)], static_cast<std::size_t>(piece.length));
  }
}

// Rows [n, head_dim] stored with a row stride of `row_stride` elements
// (>= head_dim); the gap between rows is filled with NaN / NaN bits.
struct RowBuffer {
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;
  TensorView view;

  RowBuffer(DType dtype, std::int64_t n, std::int64_t head_dim, std::int64_t row_stride) {
    const auto count = static_cast<std::size_t>(n * row_stride);
    if (dtype == DType::kF32) {
      f32.assign(count, std::nanf(""));
      view = TensorView::strided(f32.data(), dtype, {n, head_dim}, {row_stride, 1});
    } else {
      bf16.assign(count, 0x7FC1);
      view = TensorView::strided(bf16.data(), dtype, {n, head_dim}, {row_stride, 1});
    }
  }
  void set(std::int64_t i, std::int64_t d, float value) {
    const auto at = static_cast<std::size_t>(i * view.stride[0] + d);
    if (view.dtype == DType::kF32) {
      f32[at] = value;
    } else {
      bf16[at] = f32_to_bf16(value);
    }
  }
  float get(std::int64_t i, std::int64_t d) const {
    const auto at = static_cast<std::size_t>(i * view.stride[0] + d);
    return view.dtype == DType::kF32 ? f32[at] : bf16_to_f32(bf16[at]);
  }
};

// Slots as i32 or i64 with an element stride (>= 1); gaps hold a value that
// is out of range for any test cache, so reading one would be caught.
struct SlotBuffer {
  std::vector<std::int32_t> i32;
  std::vector<std::int64_t> i64;
  TensorView view;

  SlotBuffer(DType dtype, const std::vector<std::int64_t>& slots, std::int64_t stride) {
    const auto n = static_cast<std::int64_t>(slots.size());
    const auto count = static_cast<std::size_t>(n * stride);
    if (dtype == DType::kI32) {
      i32.assign(count, 1 << 30);
      for (std::size_t i = 0; i < slots.size(); ++i)
        i32[i * static_cast<std::size_t>(stride)] = static_cast<std::int32_t>(slots[i]);
      view = TensorView::strided(i32.data(), dtype, {n}, {stride});
    } else {
      i64.assign(count, std::int64_t{1} << 40);
      for (std::size_t i = 0; i < slots.size(); ++i) i64[i * static_cast<std::size_t>(stride)] = slots[i];
      view = TensorView::strided(i64.data(), dtype, {n}, {stride});
    }
  }
};

}  // namespace smla::testing
