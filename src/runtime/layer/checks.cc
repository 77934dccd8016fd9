#include "src/runtime/layer/checks.h"

#include <fmt/format.h>

#include <string>

namespace smla::layer_detail {

Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::initializer_list<std::int64_t> shape, DeviceKind device) {
  std::string dtype_list;
  bool dtype_ok = false;
  for (DType d : dtypes) {
    if (!dtype_list.empty()) dtype_list += " or ";
    dtype_list += dtype_name(d);
    dtype_ok = dtype_ok || d == t.dtype;
  }
  std::string expected_shape = "[";
  for (std::int64_t e : shape) {
    if (expected_shape.size() > 1) expected_shape += ", ";
    expected_shape += e == kAnyExtent ? std::string("*") : std::to_string(e);
  }
  expected_shape += "]";
  if (!t.present()) return invalid_argument(name, fmt::format("a {} tensor {}", dtype_list, expected_shape), "absent");
  if (t.device.kind != device) {
    return invalid_argument(name, fmt::format("a {} tensor", device_kind_name(device)), t.describe());
  }
  if (!dtype_ok) return invalid_argument(name, fmt::format("dtype {}", dtype_list), dtype_name(t.dtype));
  if (t.rank != static_cast<int>(shape.size())) {
    return invalid_argument(name, fmt::format("rank {} {}", shape.size(), expected_shape),
                            fmt::format("rank {} {}", t.rank, t.shape_string()));
  }
  int d = 0;
  for (std::int64_t e : shape) {
    const auto i = static_cast<std::size_t>(d);
    if (t.shape[i] < 0 || (e != kAnyExtent && t.shape[i] != e)) {
      return invalid_argument(name, fmt::format("shape {}", expected_shape), t.shape_string());
    }
    if (t.stride[i] < 0) return invalid_argument(name, "non-negative strides", t.describe());
    ++d;
  }
  if (t.rank > 0 && t.shape[static_cast<std::size_t>(t.rank - 1)] > 1 &&
      t.stride[static_cast<std::size_t>(t.rank - 1)] != 1) {
    return invalid_argument(name, "a contiguous last dimension (stride 1)", t.describe());
  }
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  return Status::Ok();
}

Status check_index_vector(const TensorView& t, std::string_view name, std::int64_t length, DeviceKind device) {
  if (!t.present()) return invalid_argument(name, fmt::format("an i32 or i64 vector [{}]", length), "absent");
  if (t.device.kind != device) {
    return invalid_argument(name, fmt::format("a {} tensor", device_kind_name(device)), t.describe());
  }
  if (t.dtype != DType::kI32 && t.dtype != DType::kI64) {
    return invalid_argument(name, "dtype i32 or i64", dtype_name(t.dtype));
  }
  if (t.rank != 1 || t.shape[0] != length) {
    return invalid_argument(name, fmt::format("shape [{}]", length), t.shape_string());
  }
  if (t.stride[0] < 0) return invalid_argument(name, "a non-negative stride", t.describe());
  if (length > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  return Status::Ok();
}

Status check_block_table(const TensorView& t, std::string_view name, DeviceKind device) {
  if (!t.present() || t.rank != 2 || t.dtype != DType::kI32 || t.device.kind != device) {
    return invalid_argument(name, fmt::format("a {} i32 table [R, max_blocks]", device == DeviceKind::kCuda ? "cuda" : "cpu"),
                            t.present() ? t.describe() : "absent");
  }
  if (t.shape[0] < 0 || t.shape[1] < 0 || t.stride[0] < 0 || t.stride[1] < 0) {
    return invalid_argument(name, "non-negative shape and strides", t.describe());
  }
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  return Status::Ok();
}

Status check_positions(const TensorView& positions, std::string_view name, std::int64_t max_positions) {
  for (std::int64_t i = 0; i < positions.shape[0]; ++i) {
    const std::int64_t p = read_index(positions, i);
    if (p < 0 || p >= max_positions) {
      return out_of_range(fmt::format("{}[{}]", name, i), fmt::format("a position in [0, {})", max_positions),
                          std::to_string(p));
    }
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
