// Split-KV combine: merges the normalised f32 partials of each (token, head)
// by their sums and raw maxima and adds the attention sink to the denominator.
// One warp per head; each lane owns 16 of the 512 value columns.
#include <cuda_bf16.h>

#include <cmath>

#include "src/cuda/sparse_attention_kernel.cuh"
#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {
namespace {

constexpr int kCombineWarps = 8;

__global__ void __launch_bounds__(kCombineWarps * 32) split_combine_kernel(const __grid_constant__ SparseAttentionParams p) {
  const int token = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y) * kCombineWarps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (head >= p.num_heads) return;
  const std::int64_t plane = static_cast<std::int64_t>(p.num_tokens) * p.num_heads;
  const std::int64_t at = static_cast<std::int64_t>(token) * p.num_heads + head;

  // Split s holds the raw max m_s, the sum l_s of exp2((s - m_s) * scale_log2) and,
  // where l_s != 0, out_s = its accumulator / l_s. With M the largest m_s of the
  // splits that attended something, split s weighs w_s = l_s * exp2((m_s - M) *
  // scale_log2): every exponent is <= 0, so no lse overflow can creep in. A NaN
  // l_s (a NaN score in that split) makes the whole row NaN; l_s == 0 is a split
  // that attended nothing, skipped (its partial was never written).
  float m = -INFINITY;
  bool attended = false;
  for (int s = 0; s < p.num_splits; ++s) {
    const float l = p.partial_sum[s * plane + at];
    if (l == 0.0f) continue;
    attended = true;
    m = fmaxf(m, p.partial_max[s * plane + at]);  // a NaN split's max may be -inf: its NaN l still counts
  }
  std::uint16_t* out = p.out + token * p.stride_out_t + head * p.stride_out_h;
  if (!attended) {  // no split attended anything
    for (int c = lane * 2; c < kValueDim; c += 64) store_bf16_pair(p, out + c, 0.0f, 0.0f);
    if (lane == 0 && p.lse != nullptr) p.lse[token * p.stride_lse_t + head * p.stride_lse_h] = INFINITY;
    if (lane == 0 && p.max_logits != nullptr) p.max_logits[token * p.stride_max_t + head * p.stride_max_h] = -INFINITY;
    return;
  }
  const float reference = m == -INFINITY ? 0.0f : m;  // only NaN splits: keeps -inf - -inf out (the sum is NaN anyway)

  float sum = 0.0f;
  float4 acc[4] = {};
  for (int s = 0; s < p.num_splits; ++s) {
    const float l = p.partial_sum[s * plane + at];
    if (l == 0.0f) continue;  // empty split: its partial was never written
    const float weight = l * exp2f((p.partial_max[s * plane + at] - reference) * p.scale_log2);
    sum += weight;
    const float4* part = reinterpret_cast<const float4*>(p.partial_out + (s * plane + at) * kValueDim);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = part[lane + 32 * i];
      acc[i].x += weight * v.x;
      acc[i].y += weight * v.y;
      acc[i].z += weight * v.z;
      acc[i].w += weight * v.w;
    }
  }
  // The same finish as an unsplit row (sparse_attention_kernel.cuh): m and sum are the row's statistics.
  const float inv = row_output_factor(p, head, m, sum);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 4 * (lane + 32 * i);
    store_bf16_pair(p, out + col, acc[i].x * inv, acc[i].y * inv);
    store_bf16_pair(p, out + col + 2, acc[i].z * inv, acc[i].w * inv);
  }
  if (lane == 0 && p.lse != nullptr) p.lse[token * p.stride_lse_t + head * p.stride_lse_h] = row_lse(p, m, sum);
  if (lane == 0 && p.max_logits != nullptr) {
    p.max_logits[token * p.stride_max_t + head * p.stride_max_h] = row_max_logit(p, m, sum);
  }
}

}  // namespace

cudaError_t launch_split_combine(const SparseAttentionParams& params, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.num_tokens),
                  static_cast<unsigned>((params.num_heads + kCombineWarps - 1) / kCombineWarps));
  split_combine_kernel<<<grid, kCombineWarps * 32, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace smla::cuda
