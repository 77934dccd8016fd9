// quantize_into_cache / gather_from_cache: validate everything (including
// every slot value) first, then encode or decode one token at a time through
// kv_rows.h, which owns the byte layout of each format.
#include "smla/codec.h"

#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "src/core/kv_rows.h"

namespace smla {
namespace {

bool is_float_row_dtype(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF32; }

Status require_cpu(const TensorView& t, std::string_view name) {
  if (t.device.kind != DeviceKind::kCpu) {
    return invalid_argument(name, "a cpu tensor (codecs run on the host)", device_kind_name(t.device.kind));
  }
  return Status::Ok();
}

// rows (quantize input) and out (gather output) share one contract:
// [n, head_dim] bf16/f32, last dim contiguous, any row stride.
Status validate_float_rows(const TensorView& t, std::string_view name, const KvFormatInfo& format) {
  if (!t.present()) return invalid_argument(name, "a tensor", "an absent tensor");
  SMLA_RETURN_IF_ERROR(require_cpu(t, name));
  if (t.rank != 2) {
    return invalid_argument(name, fmt::format("rank 2 [n, {}]", format.head_dim),
                            fmt::format("rank {} {}", t.rank, t.shape_string()));
  }
  if (!is_float_row_dtype(t.dtype)) return invalid_argument(name, "dtype bf16 or f32", dtype_name(t.dtype));
  if (t.shape[0] < 0 || t.shape[1] != format.head_dim) {
    return invalid_argument(name, fmt::format("shape [n, {}] (head dim of format {})", format.head_dim, format.name),
                            t.shape_string());
  }
  if (t.stride[1] != 1) return invalid_argument(name, "a contiguous last dim (stride[1] == 1)", t.describe());
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  return Status::Ok();
}

Status validate_slots(const TensorView& slots, std::int64_t num_rows, std::string_view rows_name) {
  if (!slots.present()) return invalid_argument("slots", "a tensor", "an absent tensor");
  SMLA_RETURN_IF_ERROR(require_cpu(slots, "slots"));
  if (slots.rank != 1) {
    return invalid_argument("slots", "rank 1 [n]", fmt::format("rank {} {}", slots.rank, slots.shape_string()));
  }
  if (slots.dtype != DType::kI32 && slots.dtype != DType::kI64) {
    return invalid_argument("slots", "dtype i32 or i64", dtype_name(slots.dtype));
  }
  if (slots.shape[0] != num_rows) {
    return invalid_argument("slots", fmt::format("shape [{}] (one slot per row of {})", num_rows, rows_name),
                            slots.shape_string());
  }
  if (slots.shape[0] > 0 && slots.data == nullptr) return invalid_argument("slots", "non-null data", "nullptr");
  return Status::Ok();
}

std::int64_t slot_at(const TensorView& slots, std::int64_t i) {
  const std::int64_t offset = i * slots.stride[0];
  if (slots.dtype == DType::kI32) return slots.ptr<const std::int32_t>()[offset];
  return slots.ptr<const std::int64_t>()[offset];
}

// Runs before anything is written, so a bad slot anywhere leaves the cache
// (or the output) untouched.
Status check_slot_values(const TensorView& slots, std::int64_t num_slots) {
  for (std::int64_t i = 0; i < slots.shape[0]; ++i) {
    const std::int64_t slot = slot_at(slots, i);
    if (slot != -1 && (slot < 0 || slot >= num_slots)) {
      return out_of_range(fmt::format("slots[{}]", i), fmt::format("-1 or a slot in [0, {})", num_slots),
                          fmt::format("{}", slot));
    }
  }
  return Status::Ok();
}

Status validate_call(const KvCacheView& cache, const TensorView& rows, std::string_view rows_name,
                     const TensorView& slots) {
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, "cache"));
  SMLA_RETURN_IF_ERROR(require_cpu(cache.pages, "cache"));
  const KvFormatInfo format = kv_format_info(cache.format);
  SMLA_RETURN_IF_ERROR(validate_float_rows(rows, rows_name, format));
  SMLA_RETURN_IF_ERROR(validate_slots(slots, rows.shape[0], rows_name));
  return check_slot_values(slots, cache.num_slots());
}

void load_row(const TensorView& rows, std::int64_t i, int head_dim, float* row) {
  const std::int64_t offset = i * rows.stride[0];
  if (rows.dtype == DType::kF32) {
    const float* src = rows.ptr<const float>() + offset;
    for (int d = 0; d < head_dim; ++d) row[d] = src[d];
  } else {
    const std::uint16_t* src = rows.ptr<const std::uint16_t>() + offset;
    for (int d = 0; d < head_dim; ++d) row[d] = bf16_to_f32(src[d]);
  }
}

void store_row(const float* row, int head_dim, const TensorView& out, std::int64_t i) {
  const std::int64_t offset = i * out.stride[0];
  if (out.dtype == DType::kF32) {
    float* dst = out.ptr<float>() + offset;
    for (int d = 0; d < head_dim; ++d) dst[d] = row[d];
  } else {
    std::uint16_t* dst = out.ptr<std::uint16_t>() + offset;
    for (int d = 0; d < head_dim; ++d) dst[d] = f32_to_bf16(row[d]);
  }
}

template <class FORMAT>
void quantize_rows(const KvCacheView& cache, const TensorView& rows, const TensorView& slots) {
  float row[FORMAT::kHeadDim];
  // In order, so with duplicate slots the last row wins.
  for (std::int64_t i = 0; i < rows.shape[0]; ++i) {
    const std::int64_t slot = slot_at(slots, i);
    if (slot == -1) continue;
    load_row(rows, i, FORMAT::kHeadDim, row);
    std::int64_t entry = 0;
    std::uint8_t* page = detail::writable_page_of_slot(cache, slot, &entry);
    detail::encode_token<FORMAT>(row, page, cache.page_size(), entry, cache.fp8_scale);
  }
}

template <class FORMAT>
void gather_rows(const KvCacheView& cache, const TensorView& slots, const TensorView& out) {
  float row[FORMAT::kHeadDim];
  for (std::int64_t i = 0; i < out.shape[0]; ++i) {
    const std::int64_t slot = slot_at(slots, i);
    if (slot == -1) {
      for (float& value : row) value = 0.0f;
    } else {
      std::int64_t entry = 0;
      const std::uint8_t* page = detail::page_of_slot(cache, slot, &entry);
      detail::decode_token<FORMAT>(page, cache.page_size(), entry, cache.fp8_scale, row);
    }
    store_row(row, FORMAT::kHeadDim, out, i);
  }
}

}  // namespace

Status quantize_into_cache(const KvCacheView& cache, const TensorView& rows, const TensorView& slots) {
  SMLA_RETURN_IF_ERROR(validate_call(cache, rows, "rows", slots));
  visit_kv_format(cache.format, [&](auto traits) { quantize_rows<decltype(traits)>(cache, rows, slots); });
  return Status::Ok();
}

Status gather_from_cache(const KvCacheView& cache, const TensorView& slots, const TensorView& out) {
  SMLA_RETURN_IF_ERROR(validate_call(cache, out, "out", slots));
  visit_kv_format(cache.format, [&](auto traits) { gather_rows<decltype(traits)>(cache, slots, out); });
  return Status::Ok();
}

}  // namespace smla
