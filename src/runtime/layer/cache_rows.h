// Internal: writing one 512-dim row into a paged attention cache of any
// 512-dim format (the byte layout itself lives in src/core/kv_rows.h).
#pragma once

#include <cstdint>
#include <vector>

#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "src/core/kv_rows.h"

namespace smla::layer_detail {

inline std::uint8_t* cache_page(const KvCacheView& cache, std::int64_t slot, std::int64_t* entry) {
  *entry = slot % cache.page_size();
  return static_cast<std::uint8_t*>(cache.pages.data) + (slot / cache.page_size()) * cache.page_stride_bytes();
}

// Whether a format's rows are the 512-dim V4 vector (the caches the layer ops write).
template <class Format>
inline constexpr bool kRow512Format = Format::kHeadDim == 512 && Format::kValueDim == 512;

// Calls fn(Format{}) for a 512-dim cache format (validate_row_cache_512); nothing for the others.
template <class Fn>
void visit_row_512_format(KvFormat format, Fn&& fn) {
  visit_kv_format(format, [&](auto traits) {
    if constexpr (kRow512Format<decltype(traits)>) fn(traits);
  });
}

// The 512-dim formats, in KvFormat order (the layer ops' Capabilities::formats).
std::vector<KvFormat> row_512_formats();

// Encodes row[512] (rounded to bf16 first, then the format's quantization) at `slot`.
// Precondition: validated 512-dim cache, 0 <= slot < num_slots.
inline void store_row_512(const KvCacheView& cache, std::int64_t slot, const float* row) {
  std::int64_t entry = 0;
  std::uint8_t* page = cache_page(cache, slot, &entry);
  visit_row_512_format(cache.format, [&](auto traits) {
    detail::encode_token<decltype(traits)>(row, page, cache.page_size(), entry, cache.fp8_scale);
  });
}

// Decodes the row at `slot` into out[512]. Same preconditions.
inline void load_row_512(const KvCacheView& cache, std::int64_t slot, float* out) {
  std::int64_t entry = 0;
  const std::uint8_t* page = cache_page(cache, slot, &entry);
  visit_row_512_format(cache.format, [&](auto traits) {
    detail::decode_token<decltype(traits)>(page, cache.page_size(), entry, cache.fp8_scale, out);
  });
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
