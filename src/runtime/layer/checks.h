// Internal: argument checks and element access shared by the layer ops.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "smla/numeric.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::layer_detail {

inline constexpr std::int64_t kAnyExtent = -1;

// Present, on device kind `device` (the CPU unless given), one of `dtypes`, rank == shape.size(), every extent
// equal to shape[i] unless kAnyExtent, non-negative strides, last dim
// contiguous, non-null data when non-empty.
Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::initializer_list<std::int64_t> shape, DeviceKind device = DeviceKind::kCpu);

// A rank-1 i32/i64 vector of `length` entries on device kind `device`.
Status check_index_vector(const TensorView& t, std::string_view name, std::int64_t length,
                          DeviceKind device = DeviceKind::kCpu);

// An i32 table [R, max_blocks] on device kind `device`: non-negative shape and
// strides, non-null data when non-empty.
Status check_block_table(const TensorView& t, std::string_view name, DeviceKind device = DeviceKind::kCpu);

// Every position in [0, max_positions).
Status check_positions(const TensorView& positions, std::string_view name, std::int64_t max_positions);

// Element i of a rank-1 i32/i64 vector (checked by check_index_vector).
inline std::int64_t read_index(const TensorView& v, std::int64_t i) {
  if (v.dtype == DType::kI64) return v.ptr<const std::int64_t>()[i * v.stride[0]];
  return v.ptr<const std::int32_t>()[i * v.stride[0]];
}

// Element [i, j] of a rank-2 i32 table.
inline std::int64_t read_table(const TensorView& v, std::int64_t i, std::int64_t j) {
  return v.ptr<const std::int32_t>()[i * v.stride[0] + j * v.stride[1]];
}

// Loads `n` contiguous values (f32 or bf16) starting at element offset `offset`.
inline void load_f32(const TensorView& t, std::int64_t offset, int n, float* out) {
  if (t.dtype == DType::kF32) {
    const float* p = t.ptr<const float>() + offset;
    for (int i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const std::uint16_t* p = t.ptr<const std::uint16_t>() + offset;
    for (int i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
  }
}
inline void load_f64(const TensorView& t, std::int64_t offset, int n, double* out) {
  if (t.dtype == DType::kF32) {
    const float* p = t.ptr<const float>() + offset;
    for (int i = 0; i < n; ++i) out[i] = static_cast<double>(p[i]);
  } else {
    const std::uint16_t* p = t.ptr<const std::uint16_t>() + offset;
    for (int i = 0; i < n; ++i) out[i] = static_cast<double>(bf16_to_f32(p[i]));
  }
}

}  // namespace smla::layer_detail
