#include "src/layer/cache_rows.h"

#include <fmt/format.h>

#include "src/layer/checks.h"

namespace smla::layer_detail {

Status validate_row_cache_512(const KvCacheView& cache, std::string_view name) {
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, name));
  if (cache.pages.device.kind != DeviceKind::kCpu) return invalid_argument(name, "a cpu cache", cache.pages.describe());
  if (kv_format_info(cache.format).head_dim != V4Fp8Format::kHeadDim) {
    return invalid_argument(name, "a 512-dim DeepSeek-V4 format (v4-fp8, bf16-rows, fp8-rows)",
                            kv_format_name(cache.format));
  }
  return Status::Ok();
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
