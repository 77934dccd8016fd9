// Internal: argument checks shared by the metadata entry points. Each returns
// a Status naming the argument, the expected and the actual value.
#pragma once

#include <cstdint>
#include <string_view>

#include "smla/status.h"
#include "smla/tensor.h"
#include "src/core/metadata/metadata_rules.h"

namespace smla::detail {

// Present, on the host, of `dtype` and `rank`, with non-negative extents and strides.
Status check_host_view(const TensorView& view, std::string_view name, DType dtype, int rank);
// shape[dim] >= min_extent.
Status check_min_extent(const TensorView& view, std::string_view name, int dim, std::int64_t min_extent);
// shape[dim] == extent.
Status check_extent(const TensorView& view, std::string_view name, int dim, std::int64_t extent);
// An i32 block table with at least `rows` rows.
Status check_block_table(const TensorView& table, std::string_view name, std::int64_t rows);

// Element accessors over strided views (the caller has checked the bounds).
template <class T>
T& at1(const TensorView& v, std::int64_t i) {
  return static_cast<T*>(v.data)[i * v.stride[0]];
}
template <class T>
T* row_ptr(const TensorView& v, std::int64_t i) {
  // An empty view may have null data: offsetting a null pointer is undefined, and no row of it is read.
  if (v.data == nullptr) return nullptr;
  return static_cast<T*>(v.data) + i * v.stride[0];
}

inline BlockTableRow table_row(const TensorView& table, std::int64_t req) {
  if (req < 0 || req >= table.shape[0]) return {};
  return {row_ptr<const std::int32_t>(table, req), table.stride[1], table.shape[1]};
}

}  // namespace smla::detail
