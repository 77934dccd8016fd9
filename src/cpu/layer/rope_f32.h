// Internal (kCpu): GPT-J rotation of 64 f32 values with a table row cos[32] || sin[32].
#pragma once

#include "smla/rope.h"

namespace smla::layer_detail {

inline void rotate_f32(float* x, const float* cos_sin, RopeDirection direction) {
  const float sign = direction == RopeDirection::kForward ? 1.0f : -1.0f;
  for (int p = 0; p < kRopePairs; ++p) {
    const float c = cos_sin[p];
    const float s = sign * cos_sin[kRopePairs + p];
    const float even = x[2 * p];
    const float odd = x[2 * p + 1];
    x[2 * p] = even * c - odd * s;
    x[2 * p + 1] = even * s + odd * c;
  }
}

}  // namespace smla::layer_detail
