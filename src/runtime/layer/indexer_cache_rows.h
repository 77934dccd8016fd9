// Internal: byte access to the indexer key cache (layout in smla/indexer_cache.h).
#pragma once

#include <cstdint>

#include "smla/indexer_cache.h"

namespace smla::layer_detail {

inline std::uint8_t* indexer_page(const IndexerCacheView& cache, std::int64_t slot, std::int64_t* entry) {
  *entry = slot % cache.page_size();
  return static_cast<std::uint8_t*>(cache.pages.data) + (slot / cache.page_size()) * cache.pages.stride[0];
}

// Rounds row[128] to bf16 and stores it with one power-of-two scale (the
// production tile rule of kv_format.h over all 128 values). 0 <= slot < num_slots.
void encode_indexer_key(const IndexerCacheView& cache, std::int64_t slot, const float* row);

}  // namespace smla::layer_detail
