// The indexer key cache codec (spec 2.5).
#include "smla/indexer_cache.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/core/argument_checks.h"
#include "src/runtime/layer/indexer_cache_rows.h"

namespace smla {

Status validate_indexer_cache(const IndexerCacheView& cache, std::string_view name) {
  const TensorView& t = cache.pages;
  constexpr int kRow = IndexerFp8Format::kBytesPerToken;
  if (!t.present()) return invalid_argument(name, "an indexer cache tensor", "an absent tensor");
  SMLA_RETURN_IF_ERROR(detail::check_device(t, name, DeviceKind::kCpu));
  if (t.rank != 3 || t.dtype != DType::kU8 || t.shape[2] != kRow) {
    return invalid_argument(name, fmt::format("u8 [num_pages, page_size, {}]", kRow),
                            fmt::format("{}{}", dtype_name(t.dtype), t.shape_string()));
  }
  if (t.shape[0] < 0 || t.shape[1] < 1) return invalid_argument(name, "num_pages >= 0 and page_size >= 1", t.shape_string());
  if (t.stride[2] != 1 || t.stride[1] != kRow) {
    return invalid_argument(name, fmt::format("row strides [*, {}, 1]", kRow), t.describe());
  }
  const std::int64_t content = IndexerFp8Format::page_content_bytes(t.shape[1]);
  if (t.shape[0] > 1 && t.stride[0] < content) {
    return invalid_argument(name, fmt::format("page stride >= {} bytes", content), fmt::format("{} bytes", t.stride[0]));
  }
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  return Status::Ok();
}

void decode_indexer_key(const IndexerCacheView& cache, std::int64_t slot, float* out) {
  std::int64_t entry = 0;
  const std::uint8_t* page = layer_detail::indexer_page(cache, slot, &entry);
  const std::uint8_t* codes = page + IndexerFp8Format::data_offset(entry, cache.page_size());
  float scale;
  std::memcpy(&scale, page + IndexerFp8Format::scale_offset(entry, cache.page_size()), sizeof scale);
  for (int i = 0; i < IndexerFp8Format::kHeadDim; ++i) out[i] = e4m3_to_f32(codes[i]) * scale;
}

namespace layer_detail {

void encode_indexer_key(const IndexerCacheView& cache, std::int64_t slot, const float* row) {
  std::int64_t entry = 0;
  std::uint8_t* page = indexer_page(cache, slot, &entry);
  std::uint8_t* codes = page + IndexerFp8Format::data_offset(entry, cache.page_size());
  float rounded[IndexerFp8Format::kHeadDim];
  float amax = 0.0f;
  for (int i = 0; i < IndexerFp8Format::kHeadDim; ++i) {
    rounded[i] = round_to_bf16(row[i]);
    const float a = std::fabs(rounded[i]);
    if (std::isfinite(a) && a > amax) amax = a;
  }
  const int e = fp8_tile_exponent(amax);
  for (int i = 0; i < IndexerFp8Format::kHeadDim; ++i) codes[i] = f32_to_e4m3(std::ldexp(rounded[i], -e));
  const float scale = std::ldexp(1.0f, e);
  std::memcpy(page + IndexerFp8Format::scale_offset(entry, cache.page_size()), &scale, sizeof scale);
}

}  // namespace layer_detail
}  // namespace smla
