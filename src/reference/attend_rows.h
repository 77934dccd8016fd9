// Internal: the float64 softmax-attention core the reference backend uses for
// both ops, over key/value rows already gathered and dequantized.
#pragma once

#include <cstdint>
#include <vector>

namespace smla::reference {

// Attention of one query head over `rows` (row j at keys + j * d_qk; its value
// is the first d_v entries). sink is the per-head logit (-inf when absent).
struct HeadResult {
  double lse;         // log(sum_j exp(s_j)), +inf when there are no rows
  double max_logit;   // max_j s_j, -inf when there are no rows
};
HeadResult attend_rows(const double* q, const std::vector<double>& keys, std::int64_t num_rows, int d_qk, int d_v,
                       double softmax_scale, double sink, double* out);

}  // namespace smla::reference
