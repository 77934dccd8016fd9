// Internal: writing one 512-dim row into a paged attention cache of any
// 512-dim format (the byte layout itself lives in src/core/kv_rows.h).
#pragma once

#include <cstdint>

#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "src/core/kv_rows.h"

namespace smla::layer_detail {

inline std::uint8_t* cache_page(const KvCacheView& cache, std::int64_t slot, std::int64_t* entry) {
  *entry = slot % cache.page_size();
  return static_cast<std::uint8_t*>(cache.pages.data) + (slot / cache.page_size()) * cache.page_stride_bytes();
}

// Encodes row[512] (rounded to bf16 first, then the format's quantization) at `slot`.
// Precondition: validated 512-dim cache, 0 <= slot < num_slots.
inline void store_row_512(const KvCacheView& cache, std::int64_t slot, const float* row) {
  std::int64_t entry = 0;
  std::uint8_t* page = cache_page(cache, slot, &entry);
  switch (cache.format) {
    case KvFormat::kV4Fp8:
      detail::encode_token<V4Fp8Format>(row, page, cache.page_size(), entry, cache.fp8_scale);
      break;
    case KvFormat::kBf16Rows:
      detail::encode_token<Bf16RowsFormat>(row, page, cache.page_size(), entry, cache.fp8_scale);
      break;
    case KvFormat::kFp8Rows:
      detail::encode_token<Fp8RowsFormat>(row, page, cache.page_size(), entry, cache.fp8_scale);
      break;
    case KvFormat::kV32Fp8: break;  // rejected by validate_row_cache_512
  }
}

// Decodes the row at `slot` into out[512]. Same preconditions.
inline void load_row_512(const KvCacheView& cache, std::int64_t slot, float* out) {
  std::int64_t entry = 0;
  const std::uint8_t* page = cache_page(cache, slot, &entry);
  switch (cache.format) {
    case KvFormat::kV4Fp8:
      detail::decode_token<V4Fp8Format>(page, cache.page_size(), entry, cache.fp8_scale, out);
      break;
    case KvFormat::kBf16Rows:
      detail::decode_token<Bf16RowsFormat>(page, cache.page_size(), entry, cache.fp8_scale, out);
      break;
    case KvFormat::kFp8Rows:
      detail::decode_token<Fp8RowsFormat>(page, cache.page_size(), entry, cache.fp8_scale, out);
      break;
    case KvFormat::kV32Fp8: break;
  }
}

// validate_kv_cache plus: pages on device kind `device`, the format's rows are
// the 512-dim V4 vector.
Status validate_row_cache_512(const KvCacheView& cache, std::string_view name,
                              DeviceKind device = DeviceKind::kCpu);

// validate_indexer_cache for pages on device kind `device`.
Status check_indexer_cache(const IndexerCacheView& cache, std::string_view name, DeviceKind device);

// Every slot in [-1, num_slots). `slots` is a checked index vector.
Status check_slots(const TensorView& slots, std::string_view name, std::int64_t num_slots);

}  // namespace smla::layer_detail
