// Internal: the argument checks every op family shares (attention, the layer
// ops, step metadata), host and device alike. Each failure names the argument,
// the expected and the actual value; none reads a value in device memory.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::detail {

inline constexpr std::int64_t kAnyExtent = -1;

// One expected extent: a size (kAnyExtent: any non-negative size) and, where
// the message should name it, a symbol: {6, "T"} prints "T=6",
// {kAnyExtent, "k_main"} "k_main", 512 "512", kAnyExtent "*".
struct Extent {
  constexpr Extent() = default;
  constexpr Extent(std::int64_t expected) : size(expected) {}  // shapes read as {tokens, kAnyExtent, 512}
  constexpr Extent(std::int64_t expected, std::string_view printed_as) : size(expected), symbol(printed_as) {}
  std::int64_t size = kAnyExtent;
  std::string_view symbol;
};

// The strides a tensor argument may have. Kernels that load rows need the last
// dimension contiguous; views read element by element need neither rule.
struct StrideRule {
  bool last_dim_contiguous = true;  // stride 1 wherever the last extent is > 1
  bool non_negative = true;
};
inline constexpr StrideRule kNonNegativeStrides{.last_dim_contiguous = false, .non_negative = true};

// On device kind `device`.
Status check_device(const TensorView& t, std::string_view name, DeviceKind device);

// Present, on `device`, one of `dtypes`, rank == extents.size(), every extent
// as expected, strides by `strides`, non-null data when non-empty (in that order).
Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::initializer_list<Extent> extents, DeviceKind device = DeviceKind::kCpu,
                    StrideRule strides = {});
// check_tensor when `t` is present; an absent optional argument passes.
Status check_optional_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                             std::initializer_list<Extent> extents, DeviceKind device = DeviceKind::kCpu,
                             StrideRule strides = {});

// check_tensor of `dtype` and `rank` with any extents and any non-negative
// strides: a view read element by element, its extents checked one by one below.
Status check_strided_tensor(const TensorView& t, std::string_view name, DType dtype, int rank,
                            DeviceKind device = DeviceKind::kCpu);
// shape[dim] >= min_extent (out of range otherwise: the view is too small for the call).
Status check_min_extent(const TensorView& t, std::string_view name, int dim, std::int64_t min_extent);
// shape[dim] == extent.
Status check_extent(const TensorView& t, std::string_view name, int dim, std::int64_t extent);

// A rank-1 i32/i64 vector of `length` entries, any non-negative stride.
Status check_index_vector(const TensorView& t, std::string_view name, std::int64_t length,
                          DeviceKind device = DeviceKind::kCpu);

// An i32 table [R, max_blocks] with R >= min_rows, any non-negative strides.
Status check_block_table(const TensorView& t, std::string_view name, std::int64_t min_rows,
                         DeviceKind device = DeviceKind::kCpu);

// Every position of a host index vector (checked by check_index_vector) in [0, max_positions).
Status check_positions(const TensorView& positions, std::string_view name, std::int64_t max_positions);

}  // namespace smla::detail
