// Internal (kReference): GPT-J rotation of 64 doubles, angles recomputed in
// double from the table's inverse frequencies (never from the f32 table).
#pragma once

#include <cmath>
#include <cstdint>

#include "smla/rope.h"

namespace smla::layer_detail {

inline void rotate_f64(double* x, const RopeTable& table, std::int64_t position, RopeDirection direction) {
  for (int p = 0; p < kRopePairs; ++p) {
    const double angle = static_cast<double>(position) * table.inverse_frequencies()[static_cast<std::size_t>(p)];
    const double c = std::cos(angle);
    const double s = direction == RopeDirection::kForward ? std::sin(angle) : -std::sin(angle);
    const double even = x[2 * p];
    const double odd = x[2 * p + 1];
    x[2 * p] = even * c - odd * s;
    x[2 * p + 1] = even * s + odd * c;
  }
}

}  // namespace smla::layer_detail
