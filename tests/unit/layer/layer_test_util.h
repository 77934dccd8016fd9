// Helpers for the layer-op tests: owned buffers, paged caches, random fills.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "smla/registry.h"
#include "smla/tensor.h"

namespace smla::layer_test {

// The host backends with a registered implementation of `op` (smla/registry.h):
// the hand cases run on every one, whatever the build registers.
inline std::vector<Backend> host_backends(Op op) {
  std::vector<Backend> backends;
  for (const Implementation& implementation : implementations()) {
    if (implementation.op == op && implementation.backend != Backend::kCuda) backends.push_back(implementation.backend);
  }
  return backends;
}

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
struct Buffer {
  std::vector<T> data;
  TensorView view;
  Buffer() = default;
  Buffer(DType dtype, std::initializer_list<std::int64_t> shape, T fill = T{}) { reset(dtype, shape, fill); }
  void reset(DType dtype, std::initializer_list<std::int64_t> shape, T fill = T{}) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    data.assign(static_cast<std::size_t>(n), fill);
    view = TensorView::contiguous(data.data(), dtype, shape);
  }
  // Buffer and view stay consistent only while `data` is not resized.
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

inline void fill_uniform(std::vector<float>& v, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& x : v) x = dist(rng);
}

// An owned paged cache of a 512-dim format with padded pages (page stride >
// content), so a page-stride bug shows up. Every byte starts as 0xFF (NaN
// for e4m3, bf16 and the scales).
struct OwnedKvCache {
  std::vector<std::uint8_t> bytes;
  KvCacheView view;
  OwnedKvCache(KvFormat format, std::int64_t num_pages, std::int64_t page_size) {
    const KvFormatInfo info = kv_format_info(format);
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(info.storage_dtype));
    const std::int64_t row_bytes = info.row_elements * elem;
    const std::int64_t content = info.bytes_per_token * page_size;
    const std::int64_t page_elems = (content + 3 * row_bytes) / elem;  // padding of ~3 rows
    bytes.assign(static_cast<std::size_t>(num_pages * page_elems * elem + 64), 0xFF);
    view.format = format;
    view.pages = TensorView::strided(bytes.data(), info.storage_dtype, {num_pages, page_size, info.row_elements},
                                     {page_elems, info.row_elements, 1});
  }
};

struct OwnedIndexerCache {
  std::vector<std::uint8_t> bytes;
  IndexerCacheView view;
  OwnedIndexerCache(std::int64_t num_pages, std::int64_t page_size) {
    const std::int64_t page_bytes = IndexerFp8Format::page_content_bytes(page_size) + 40;
    bytes.assign(static_cast<std::size_t>(num_pages * page_bytes), 0xFF);
    view.pages = TensorView::strided(bytes.data(), DType::kU8, {num_pages, page_size, IndexerFp8Format::kBytesPerToken},
                                     {page_bytes, IndexerFp8Format::kBytesPerToken, 1});
  }
};

// A block table [rows, cols] of distinct pages in a shuffled order.
inline std::vector<std::int32_t> permuted_pages(std::int64_t count, std::mt19937_64& rng) {
  std::vector<std::int32_t> pages(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) pages[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(pages.begin(), pages.end(), rng);
  return pages;
}

inline float bf16_value(std::uint16_t bits) { return bf16_to_f32(bits); }

}  // namespace smla::layer_test
