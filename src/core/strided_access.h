// Internal: element access to host views through their strides, for the ops
// whose arguments src/core/argument_checks.h has checked (the caller keeps
// every index in bounds).
#pragma once

#include <cstdint>

#include "smla/numeric.h"
#include "smla/tensor.h"
#include "src/core/metadata/metadata_rules.h"

namespace smla::detail {

// Element i of a rank-1 i32/i64 vector (check_index_vector).
inline std::int64_t read_index(const TensorView& v, std::int64_t i) {
  if (v.dtype == DType::kI64) return v.ptr<const std::int64_t>()[i * v.stride[0]];
  return v.ptr<const std::int32_t>()[i * v.stride[0]];
}

// Element [i, j] of a rank-2 i32 table (check_block_table).
inline std::int64_t read_table(const TensorView& v, std::int64_t i, std::int64_t j) {
  return v.ptr<const std::int32_t>()[i * v.stride[0] + j * v.stride[1]];
}

// Loads `n` contiguous f32 or bf16 values starting at element `offset`, as float or double.
template <class Out>
void load_floats(const TensorView& t, std::int64_t offset, int n, Out* out) {
  if (t.dtype == DType::kF32) {
    const float* p = t.ptr<const float>() + offset;
    for (int i = 0; i < n; ++i) out[i] = static_cast<Out>(p[i]);
  } else {
    const std::uint16_t* p = t.ptr<const std::uint16_t>() + offset;
    for (int i = 0; i < n; ++i) out[i] = static_cast<Out>(bf16_to_f32(p[i]));
  }
}

// Element i of a rank-1 view of T.
template <class T>
T& at1(const TensorView& v, std::int64_t i) {
  return static_cast<T*>(v.data)[i * v.stride[0]];
}

// Row i of a view of T.
template <class T>
T* row_ptr(const TensorView& v, std::int64_t i) {
  // An empty view may have null data: offsetting a null pointer is undefined, and no row of it is read.
  if (v.data == nullptr) return nullptr;
  return static_cast<T*>(v.data) + i * v.stride[0];
}

// Request `req`'s row of a block table; a request outside the table gets the empty row (every lookup -1).
inline BlockTableRow table_row(const TensorView& table, std::int64_t req) {
  if (req < 0 || req >= table.shape[0]) return {};
  return {row_ptr<const std::int32_t>(table, req), table.stride[1], table.shape[1]};
}

}  // namespace smla::detail
