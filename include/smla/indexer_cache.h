// File: indexer_cache.h
//
// The C4A lightning indexer's key cache (spec 2.5), FP8 variant. One page of
// bs compressed entries:
//
//   [t*128, t*128 + 128)        128 x e4m3 key of entry t
//   [bs*128 + t*4, +4)          f32 power-of-two scale of entry t
//
// 132 bytes per entry; pages may be padded (the page stride is stride[0]).
#pragma once

#include <cstdint>
#include <string_view>

#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

struct IndexerFp8Format {
  static constexpr std::string_view kName = "indexer-fp8";
  static constexpr int kHeadDim = 128;
  static constexpr int kRopeDim = 64;  // the last 64 dims are rotated
  static constexpr int kScaleBytes = 4;
  static constexpr int kBytesPerToken = kHeadDim + kScaleBytes;  // 132
  static constexpr std::int64_t data_offset(std::int64_t t, std::int64_t /*page_size*/) { return t * kHeadDim; }
  static constexpr std::int64_t scale_offset(std::int64_t t, std::int64_t page_size) {
    return page_size * kHeadDim + t * kScaleBytes;
  }
  static constexpr std::int64_t page_content_bytes(std::int64_t page_size) { return page_size * kBytesPerToken; }
};
static_assert(IndexerFp8Format::kBytesPerToken == 132);

// u8 [num_pages, page_size, 132]; slot s = page s / page_size, entry s % page_size.
struct IndexerCacheView {
  TensorView pages;

  std::int64_t num_pages() const { return pages.shape[0]; }
  std::int64_t page_size() const { return pages.shape[1]; }
  std::int64_t num_slots() const { return pages.shape[0] * pages.shape[1]; }
};

// Rank, dtype, row size, packed rows, page stride large enough. `name` prefixes errors.
Status validate_indexer_cache(const IndexerCacheView& cache, std::string_view name);

// Reads entry `slot` (caller checked 0 <= slot < num_slots) as 128 f32 values
// (e4m3 * scale).
void decode_indexer_key(const IndexerCacheView& cache, std::int64_t slot, float* out);

}  // namespace smla
