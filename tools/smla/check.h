// The pass rule shared by `smla attn` and `smla replay --check`.
//
// bf16 outputs pass when every element is within kOutputTolerance * max|want|
// of the wanted value (max over the finite wanted elements) and NaN/+inf/-inf
// sit in the same places. Rounding the output to bf16 alone costs up to 2^-9 of
// an element's magnitude; the rest of the margin covers f32 accumulation and
// the order of the softmax sums. f32 lse / max_logits pass within
// kLseAbsTolerance (absolute) or kLseRelTolerance (relative), infinities in the
// same places.
#pragma once

#include "smla/tensor.h"
#include "testkit/testkit.h"

namespace smla::cli {

inline constexpr double kOutputTolerance = 2e-2;
inline constexpr double kLseAbsTolerance = 1e-3;
inline constexpr double kLseRelTolerance = 1e-4;

// got and want: bf16 CPU tensors of the same shape (any strides).
testkit::ErrorStats check_bf16_output(const TensorView& got, const TensorView& want);
// got and want: f32 CPU tensors of the same shape.
testkit::ErrorStats check_f32_output(const TensorView& got, const TensorView& want);

}  // namespace smla::cli
