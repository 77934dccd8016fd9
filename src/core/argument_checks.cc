#include "src/core/argument_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <span>
#include <string>

#include "src/core/strided_access.h"

namespace smla::detail {

namespace {

// The messages are built only on failure: the checks run on every call.
std::string dtype_list(std::span<const DType> dtypes) {
  std::string list;
  for (DType d : dtypes) list += fmt::format("{}{}", list.empty() ? "" : " or ", dtype_name(d));
  return list;
}

std::string expected_shape(std::span<const Extent> extents) {
  std::string s = "[";
  for (const Extent& e : extents) {
    if (s.size() > 1) s += ", ";
    if (e.symbol.empty()) {
      s += e.size == kAnyExtent ? std::string("*") : std::to_string(e.size);
    } else {
      s += e.size == kAnyExtent ? std::string(e.symbol) : fmt::format("{}={}", e.symbol, e.size);
    }
  }
  return s + "]";
}

Status check_extents(const TensorView& t, std::string_view name, std::span<const Extent> extents) {
  if (t.rank != static_cast<int>(extents.size())) {
    return invalid_argument(name, fmt::format("rank {} {}", extents.size(), expected_shape(extents)),
                            fmt::format("rank {} {}", t.rank, t.shape_string()));
  }
  for (std::size_t d = 0; d < extents.size(); ++d) {
    const std::int64_t expected = extents[d].size;
    if (t.shape[d] < 0 || (expected != kAnyExtent && t.shape[d] != expected)) {
      return invalid_argument(name, fmt::format("shape {}", expected_shape(extents)), t.shape_string());
    }
  }
  return Status::Ok();
}

// Runs after check_extents: t.rank is a valid rank.
Status check_strides(const TensorView& t, std::string_view name, StrideRule rule) {
  const auto rank = static_cast<std::size_t>(t.rank);
  if (rule.non_negative && std::any_of(t.stride.begin(), t.stride.begin() + rank, [](auto s) { return s < 0; })) {
    return invalid_argument(name, "non-negative strides", t.describe());
  }
  if (rule.last_dim_contiguous && rank > 0 && t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1) {
    return invalid_argument(name, "a contiguous last dimension (stride 1)", t.describe());
  }
  return Status::Ok();
}

Status check_tensor_of(const TensorView& t, std::string_view name, std::span<const DType> dtypes,
                       std::span<const Extent> extents, DeviceKind device, StrideRule strides) {
  if (!t.present()) {
    return invalid_argument(name, fmt::format("a {} tensor {}", dtype_list(dtypes), expected_shape(extents)),
                            "absent");
  }
  SMLA_RETURN_IF_ERROR(check_device(t, name, device));
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    return invalid_argument(name, fmt::format("dtype {}", dtype_list(dtypes)), dtype_name(t.dtype));
  }
  SMLA_RETURN_IF_ERROR(check_extents(t, name, extents));
  SMLA_RETURN_IF_ERROR(check_strides(t, name, strides));
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  return Status::Ok();
}

}  // namespace

Status check_device(const TensorView& t, std::string_view name, DeviceKind device) {
  if (t.device.kind != device) {
    return invalid_argument(name, fmt::format("a {} tensor", device_kind_name(device)),
                            device_kind_name(t.device.kind));
  }
  return Status::Ok();
}

Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::initializer_list<Extent> extents, DeviceKind device, StrideRule strides) {
  return check_tensor_of(t, name, dtypes, extents, device, strides);
}

Status check_optional_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                             std::initializer_list<Extent> extents, DeviceKind device, StrideRule strides) {
  return t.present() ? check_tensor_of(t, name, dtypes, extents, device, strides) : Status::Ok();
}

Status check_strided_tensor(const TensorView& t, std::string_view name, DType dtype, int rank, DeviceKind device) {
  if (rank < 0 || rank > kMaxRank) return internal_error(fmt::format("{}: no tensor has rank {}", name, rank));
  const std::array<Extent, kMaxRank> any_extents{};
  return check_tensor_of(t, name, {&dtype, 1}, std::span(any_extents).first(static_cast<std::size_t>(rank)), device,
                         kNonNegativeStrides);
}

Status check_min_extent(const TensorView& t, std::string_view name, int dim, std::int64_t min_extent) {
  const std::int64_t actual = t.shape[static_cast<std::size_t>(dim)];
  if (actual < min_extent) {
    return out_of_range(name, fmt::format("dimension {} of at least {}", dim, min_extent),
                        fmt::format("{} (shape {})", actual, t.shape_string()));
  }
  return Status::Ok();
}

Status check_extent(const TensorView& t, std::string_view name, int dim, std::int64_t extent) {
  const std::int64_t actual = t.shape[static_cast<std::size_t>(dim)];
  if (actual != extent) {
    return invalid_argument(name, fmt::format("dimension {} of {}", dim, extent),
                            fmt::format("{} (shape {})", actual, t.shape_string()));
  }
  return Status::Ok();
}

Status check_index_vector(const TensorView& t, std::string_view name, std::int64_t length, DeviceKind device) {
  return check_tensor(t, name, {DType::kI32, DType::kI64}, {length}, device, kNonNegativeStrides);
}

Status check_block_table(const TensorView& t, std::string_view name, std::int64_t min_rows, DeviceKind device) {
  SMLA_RETURN_IF_ERROR(check_tensor(t, name, {DType::kI32}, {{kAnyExtent, "R"}, {kAnyExtent, "max_blocks"}}, device,
                                    kNonNegativeStrides));
  return check_min_extent(t, name, 0, min_rows);
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

}  // namespace smla::detail
