#include "src/runtime/layer/cache_rows.h"

#include <fmt/format.h>

#include "src/core/argument_checks.h"
#include "src/core/strided_access.h"

namespace smla::layer_detail {

using detail::check_device;
using detail::read_index;

Status validate_row_cache_512(const KvCacheView& cache, std::string_view name, DeviceKind device) {
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, name));
  SMLA_RETURN_IF_ERROR(check_device(cache.pages, name, device));
  bool row_512 = false;
  visit_row_512_format(cache.format, [&](auto) { row_512 = true; });
  if (!row_512) {
    std::string names;
    for (KvFormat format : row_512_formats()) names += (names.empty() ? "" : ", ") + std::string(kv_format_name(format));
    return invalid_argument(name, fmt::format("a 512-dim DeepSeek-V4 format ({})", names), kv_format_name(cache.format));
  }
  return Status::Ok();
}

std::vector<KvFormat> row_512_formats() {
  std::vector<KvFormat> formats;
  for_each_kv_format([&](auto traits) {
    if constexpr (kRow512Format<decltype(traits)>) formats.push_back(decltype(traits)::kFormat);
  });
  return formats;
}

Status check_indexer_cache(const IndexerCacheView& cache, std::string_view name, DeviceKind device) {
  if (cache.pages.present()) SMLA_RETURN_IF_ERROR(check_device(cache.pages, name, device));
  IndexerCacheView metadata = cache;  // validate_indexer_cache reads shapes and strides of a cpu view
  metadata.pages.device = Device{};
  return validate_indexer_cache(metadata, name);
}

Status check_slots(const TensorView& slots, std::string_view name, std::int64_t num_slots) {
  for (std::int64_t i = 0; i < slots.shape[0]; ++i) {
    const std::int64_t s = read_index(slots, i);
    if (s < -1 || s >= num_slots) {
      return out_of_range(fmt::format("{}[{}]", name, i), fmt::format("-1 or a slot in [0, {})", num_slots),
                          std::to_string(s));
    }
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
