// Internal: the float64 softmax-attention core the reference backend uses for
// both ops, over key/value rows already gathered and dequantized.
#pragma once

#include <cstdint>
#include <vector>

#include "smla/tensor.h"

namespace smla::reference {

struct HeadResult {
  double lse;        // log(sum_j exp(s_j)), +inf when there are no rows, NaN when a score is NaN or +inf
  double max_logit;  // max_j s_j, -inf when there are no rows, NaN when lse is NaN
};

// x rounded to f32; beyond f32's range +-inf (docs/attention.md: an lse or
// max_logits past f32 is reported as +-inf, the output stays exact).
float to_f32(double x);

// Heads per call: the rows stream through the cache once per block of heads
// instead of once per head (the reference stays memory-light at V4 sizes).
inline constexpr int kHeadBlock = 8;

// Attention of num_heads (<= kHeadBlock) query heads q[h * d_qk + d] over
// `num_rows` rows (row j at keys[j * d_qk]; its value is the first d_v
// entries). sinks[h] is each head's sink logit (-inf when absent). Writes
// out[h * d_v + d] and results[h].
void attend_rows(const double* q, int num_heads, const std::vector<double>& keys, std::int64_t num_rows, int d_qk,
                 int d_v, double softmax_scale, const double* sinks, double* out, HeadResult* results);

// All heads of query token t: reads q[t] (bf16 [*, h_q, d_qk]) and sink (f32
// [h_q], may be absent), attends `keys` and stores out[t] (bf16), lse[t] and
// max_logits[t] (f32, each may be absent).
void attend_token(const TensorView& q, std::int64_t t, const TensorView& sink, const std::vector<double>& keys,
                  std::int64_t num_rows, int d_v, double softmax_scale, const TensorView& out, const TensorView& lse,
                  const TensorView& max_logits);

}  // namespace smla::reference
