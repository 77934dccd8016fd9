// Visiting the elements of a strided TensorView in row-major order.
#pragma once

#include <array>
#include <cstdint>

#include "smla/tensor.h"

namespace smla::cli {

// Calls fn(offset) with the element offset (in elements, from view.data) of
// every element of `view`, in row-major order. Nothing for an empty view.
template <class Fn>
void for_each_element_offset(const TensorView& view, Fn&& fn) {
  if (!view.present() || view.numel() <= 0) return;
  // Dimensions missing below rank 4 have extent 1.
  std::array<std::int64_t, kMaxRank> extent{1, 1, 1, 1};
  std::array<std::int64_t, kMaxRank> stride{0, 0, 0, 0};
  const int pad = kMaxRank - view.rank;
  for (int d = 0; d < view.rank; ++d) {
    extent[static_cast<std::size_t>(d + pad)] = view.shape[static_cast<std::size_t>(d)];
    stride[static_cast<std::size_t>(d + pad)] = view.stride[static_cast<std::size_t>(d)];
  }
  for (std::int64_t i0 = 0; i0 < extent[0]; ++i0) {
    for (std::int64_t i1 = 0; i1 < extent[1]; ++i1) {
      for (std::int64_t i2 = 0; i2 < extent[2]; ++i2) {
        for (std::int64_t i3 = 0; i3 < extent[3]; ++i3) {
          fn(i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]);
        }
      }
    }
  }
}

}  // namespace smla::cli
