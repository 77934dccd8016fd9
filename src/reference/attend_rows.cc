#include "src/reference/attend_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace smla::reference {

namespace {

// Four partial sums keep the float64 dot product from being one long
// dependency chain; order does not matter at this precision.
double dot(const double* a, const double* b, int n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

HeadResult attend_rows(const double* q, const std::vector<double>& keys, std::int64_t num_rows, int d_qk, int d_v,
                       double softmax_scale, double sink, double* out) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::fill(out, out + d_v, 0.0);
  if (num_rows == 0) return {kInf, -kInf};

  std::vector<double> scores(static_cast<std::size_t>(num_rows));
  double max_logit = -kInf;
  for (std::int64_t j = 0; j < num_rows; ++j) {
    const double s = softmax_scale * dot(q, keys.data() + j * d_qk, d_qk);
    scores[static_cast<std::size_t>(j)] = s;
    max_logit = std::max(max_logit, s);
  }
  double denominator = 0.0;
  for (std::int64_t j = 0; j < num_rows; ++j) {
    const double p = std::exp(scores[static_cast<std::size_t>(j)] - max_logit);
    denominator += p;
    const double* v = keys.data() + j * d_qk;
    for (int d = 0; d < d_v; ++d) out[d] += p * v[d];
  }
  const double lse = max_logit + std::log(denominator);
  // The sink joins the denominator only: exp(sink - max) on the same scale as the terms.
  const double total = sink == kInf ? kInf : denominator + std::exp(sink - max_logit);
  for (int d = 0; d < d_v; ++d) out[d] = total == kInf ? 0.0 : out[d] / total;
  return {lse, max_logit};
}

}  // namespace smla::reference
