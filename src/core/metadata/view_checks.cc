#include "src/core/metadata/view_checks.h"

#include <fmt/format.h>

namespace smla::detail {

Status check_host_view(const TensorView& view, std::string_view name, DType dtype, int rank) {
  if (!view.present() || (view.data == nullptr && view.numel() != 0)) {
    return invalid_argument(name, fmt::format("a {}-D {} tensor", rank, dtype_name(dtype)), "absent");
  }
  if (view.device.kind != DeviceKind::kCpu) {
    return invalid_argument(name, "a host (cpu) tensor", std::string(device_kind_name(view.device.kind)));
  }
  if (view.dtype != dtype) {
    return invalid_argument(name, fmt::format("dtype {}", dtype_name(dtype)), std::string(dtype_name(view.dtype)));
  }
  if (view.rank != rank) return invalid_argument(name, fmt::format("rank {}", rank), fmt::format("rank {}", view.rank));
  for (int d = 0; d < rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (view.shape[i] < 0 || view.stride[i] < 0) {
      return invalid_argument(name, "non-negative shape and strides", view.describe());
    }
  }
  return Status::Ok();
}

Status check_min_extent(const TensorView& view, std::string_view name, int dim, std::int64_t min_extent) {
  const std::int64_t actual = view.shape[static_cast<std::size_t>(dim)];
  if (actual < min_extent) {
    return out_of_range(name, fmt::format("dimension {} of at least {}", dim, min_extent),
                        fmt::format("{} (shape {})", actual, view.shape_string()));
  }
  return Status::Ok();
}

Status check_extent(const TensorView& view, std::string_view name, int dim, std::int64_t extent) {
  const std::int64_t actual = view.shape[static_cast<std::size_t>(dim)];
  if (actual != extent) {
    return invalid_argument(name, fmt::format("dimension {} of {}", dim, extent),
                            fmt::format("{} (shape {})", actual, view.shape_string()));
  }
  return Status::Ok();
}

Status check_block_table(const TensorView& table, std::string_view name, std::int64_t rows) {
  SMLA_RETURN_IF_ERROR(check_host_view(table, name, DType::kI32, 2));
  return check_min_extent(table, name, 0, rows);
}

}  // namespace smla::detail
