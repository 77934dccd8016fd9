#include "smla/kv_format.h"

#include <fmt/format.h>

namespace smla {

KvFormatInfo kv_format_info(KvFormat format) {
  return visit_kv_format(format, [format](auto traits) {
    using Traits = decltype(traits);
    return KvFormatInfo{format,           Traits::kName,        Traits::kHeadDim, Traits::kValueDim,
                        Traits::kBytesPerToken, Traits::kStorage, Traits::kRowElements, Traits::kLayout,
                        Traits::kPerTensorScale};
  });
}

std::string_view kv_format_name(KvFormat format) { return kv_format_info(format).name; }

std::string kv_format_names(std::string_view separator) {
  std::string names;
  for_each_kv_format([&](auto traits) {
    if (!names.empty()) names += separator;
    names += decltype(traits)::kName;
  });
  return names;
}

Expected<KvFormat> parse_kv_format(std::string_view name) {
  for (KvFormat f : kAllKvFormats) {
    if (kv_format_name(f) == name) return f;
  }
  return invalid_argument("kv format", "one of " + kv_format_names(), fmt::format("'{}'", name));
}

std::int64_t KvCacheView::page_stride_bytes() const {
  return pages.stride[0] * static_cast<std::int64_t>(dtype_size(pages.dtype));
}

Status validate_kv_cache(const KvCacheView& cache, std::string_view name) {
  const KvFormatInfo info = kv_format_info(cache.format);
  const TensorView& t = cache.pages;
  if (!t.present()) return invalid_argument(name, "a cache tensor", "an absent tensor");
  if (t.rank != 3) {
    return invalid_argument(name, fmt::format("rank 3 [num_pages, page_size, {}]", info.row_elements),
                            fmt::format("rank {} {}", t.rank, t.shape_string()));
  }
  if (t.dtype != info.storage_dtype) {
    return invalid_argument(name, fmt::format("dtype {} for format {}", dtype_name(info.storage_dtype), info.name),
                            dtype_name(t.dtype));
  }
  if (t.shape[2] != info.row_elements) {
    return invalid_argument(name, fmt::format("last dim {} for format {}", info.row_elements, info.name),
                            t.shape_string());
  }
  if (t.shape[0] < 0 || t.shape[1] < 1) {
    return invalid_argument(name, "num_pages >= 0 and page_size >= 1", t.shape_string());
  }
  if (t.stride[2] != 1 || t.stride[1] != info.row_elements) {
    return invalid_argument(name, fmt::format("row strides [*, {}, 1] (rows packed inside a page)", info.row_elements),
                            t.describe());
  }
  const std::int64_t content = static_cast<std::int64_t>(info.bytes_per_token) * t.shape[1];
  if (t.shape[0] > 1 && cache.page_stride_bytes() < content) {
    return invalid_argument(name, fmt::format("page stride >= {} bytes ({} tokens x {} B)", content, t.shape[1],
                                              info.bytes_per_token),
                            fmt::format("{} bytes", cache.page_stride_bytes()));
  }
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  if (info.per_tensor_scale && !(cache.fp8_scale > 0.0f && std::isfinite(cache.fp8_scale))) {
    return invalid_argument(fmt::format("{}.fp8_scale", name), "a finite positive scale", fmt::format("{}", cache.fp8_scale));
  }
  return Status::Ok();
}

}  // namespace smla
