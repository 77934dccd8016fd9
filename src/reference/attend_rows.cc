#include "src/reference/attend_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "smla/numeric.h"

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

float to_f32(double x) {
  // Round to nearest; magnitudes from FLT_MAX + half an ulp up become +-inf (a plain
  // cast of an out-of-range double is undefined behaviour in C++).
  constexpr double kOverflow = 0x1.ffffffp127;
  if (x >= kOverflow) return std::numeric_limits<float>::infinity();
  if (x <= -kOverflow) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(x);
}

void attend_rows(const double* q, int num_heads, const std::vector<double>& keys, std::int64_t num_rows, int d_qk,
                 int d_v, double softmax_scale, const double* sinks, double* out, HeadResult* results) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::fill(out, out + static_cast<std::ptrdiff_t>(num_heads) * d_v, 0.0);
  if (num_rows == 0) {
    std::fill(results, results + num_heads, HeadResult{kInf, -kInf});
    return;
  }
  // scores[h][j] = scale * <q_h, k_j>, later exp(scores - max_h).
  std::vector<double> scores(static_cast<std::size_t>(num_heads * num_rows));
  auto score = [&](int h, std::int64_t j) -> double& { return scores[static_cast<std::size_t>(h * num_rows + j)]; };
  for (std::int64_t j = 0; j < num_rows; ++j) {
    const double* k = keys.data() + j * d_qk;
    for (int h = 0; h < num_heads; ++h) score(h, j) = softmax_scale * dot(q + h * d_qk, k, d_qk);
  }
  std::vector<double> denominator(static_cast<std::size_t>(num_heads), 0.0);
  std::vector<double> max_of_row(static_cast<std::size_t>(num_heads), -kInf);
  for (int h = 0; h < num_heads; ++h) {
    double max_logit = -kInf;
    for (std::int64_t j = 0; j < num_rows; ++j) max_logit = std::max(max_logit, score(h, j));
    max_of_row[static_cast<std::size_t>(h)] = max_logit;
    for (std::int64_t j = 0; j < num_rows; ++j) {
      score(h, j) = std::exp(score(h, j) - max_logit);
      denominator[static_cast<std::size_t>(h)] += score(h, j);
    }
    // A NaN score (NaN in q or in an attended row) or a +inf one makes the sum NaN;
    // max_logit reports it too (std::max above skips NaN).
    const double sum = denominator[static_cast<std::size_t>(h)];
    results[h].max_logit = std::isnan(sum) ? std::numeric_limits<double>::quiet_NaN() : max_logit;
    results[h].lse = max_logit + std::log(sum);
  }
  // Four rows per pass over out: a quarter of the load/store traffic on it.
  std::int64_t j = 0;
  for (; j + 4 <= num_rows; j += 4) {
    const double* v0 = keys.data() + j * d_qk;
    const double* v1 = v0 + d_qk;
    const double* v2 = v1 + d_qk;
    const double* v3 = v2 + d_qk;
    for (int h = 0; h < num_heads; ++h) {
      const double p0 = score(h, j), p1 = score(h, j + 1), p2 = score(h, j + 2), p3 = score(h, j + 3);
      double* o = out + h * d_v;
      for (int d = 0; d < d_v; ++d) o[d] += (p0 * v0[d] + p1 * v1[d]) + (p2 * v2[d] + p3 * v3[d]);
    }
  }
  for (; j < num_rows; ++j) {
    const double* v = keys.data() + j * d_qk;
    for (int h = 0; h < num_heads; ++h) {
      const double p = score(h, j);
      double* o = out + h * d_v;
      for (int d = 0; d < d_v; ++d) o[d] += p * v[d];
    }
  }
  for (int h = 0; h < num_heads; ++h) {
    // The sink joins the denominator only: exp(sink - max) on the same scale as the
    // terms. IEEE arithmetic gives the documented cases: sink -inf adds 0, +inf
    // makes the row 0 (finite / inf), NaN (sink or sum) makes it NaN. max is finite
    // here unless the row is NaN anyway (scores stay far inside double's range).
    const double total = denominator[static_cast<std::size_t>(h)] + std::exp(sinks[h] - max_of_row[h]);
    double* o = out + h * d_v;
    for (int d = 0; d < d_v; ++d) o[d] /= total;
  }
}

void attend_token(const TensorView& q, std::int64_t t, const TensorView& sink, const std::vector<double>& keys,
                  std::int64_t num_rows, int d_v, double softmax_scale, const TensorView& out, const TensorView& lse,
                  const TensorView& max_logits) {
  const int d_qk = static_cast<int>(q.shape[2]);
  const std::int64_t num_heads = q.shape[1];
  std::vector<double> q_block(static_cast<std::size_t>(kHeadBlock * d_qk));
  std::vector<double> out_block(static_cast<std::size_t>(kHeadBlock * d_v));
  double sinks[kHeadBlock];
  HeadResult results[kHeadBlock];
  for (std::int64_t h0 = 0; h0 < num_heads; h0 += kHeadBlock) {
    const int heads = static_cast<int>(std::min<std::int64_t>(kHeadBlock, num_heads - h0));
    for (int i = 0; i < heads; ++i) {
      const auto* q_row = q.ptr<const std::uint16_t>() + t * q.stride[0] + (h0 + i) * q.stride[1];
      for (int d = 0; d < d_qk; ++d) q_block[static_cast<std::size_t>(i * d_qk + d)] = bf16_to_f32(q_row[d]);
      sinks[i] = sink.present() ? sink.ptr<const float>()[(h0 + i) * sink.stride[0]]
                                : -std::numeric_limits<double>::infinity();
    }
    attend_rows(q_block.data(), heads, keys, num_rows, d_qk, d_v, softmax_scale, sinks, out_block.data(), results);
    for (int i = 0; i < heads; ++i) {
      const std::int64_t h = h0 + i;
      auto* out_row = out.ptr<std::uint16_t>() + t * out.stride[0] + h * out.stride[1];
      for (int d = 0; d < d_v; ++d) {
        out_row[d] = f32_to_bf16(static_cast<float>(out_block[static_cast<std::size_t>(i * d_v + d)]));
      }
      if (lse.present()) lse.ptr<float>()[t * lse.stride[0] + h * lse.stride[1]] = to_f32(results[i].lse);
      if (max_logits.present()) {
        max_logits.ptr<float>()[t * max_logits.stride[0] + h * max_logits.stride[1]] =
            to_f32(results[i].max_logit);
      }
    }
  }
}

}  // namespace smla::reference
