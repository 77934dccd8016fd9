// Split-KV combine: merges the normalised f32 partials of each (token, head)
// by their log2-domain lse and adds the attention sink to the denominator.
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

  float lse_max = -INFINITY;
  float logit_max = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) {
    lse_max = fmaxf(lse_max, p.partial_lse[s * plane + at]);
    logit_max = fmaxf(logit_max, p.partial_max[s * plane + at]);
  }
  std::uint16_t* out = p.out + token * p.stride_out_t + head * p.stride_out_h;
  if (lse_max == -INFINITY) {  // no split attended anything
    for (int c = lane * 2; c < kValueDim; c += 64) store_bf16_pair(p, out + c, 0.0f, 0.0f);
    if (lane == 0 && p.lse != nullptr) p.lse[token * p.stride_lse_t + head * p.stride_lse_h] = INFINITY;
    if (lane == 0 && p.max_logits != nullptr) p.max_logits[token * p.stride_max_t + head * p.stride_max_h] = -INFINITY;
    return;
  }

  float sum = 0.0f;
  float4 acc[4] = {};
  for (int s = 0; s < p.num_splits; ++s) {
    const float lse = p.partial_lse[s * plane + at];
    if (lse == -INFINITY) continue;  // empty split: its partial was never written
    const float weight = exp2f(lse - lse_max);
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
  const float sink = p.sink == nullptr ? -INFINITY : p.sink[head * p.stride_sink] * kLog2e;
  const float inv = 1.0f / (sum + exp2f(sink - lse_max));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 4 * (lane + 32 * i);
    store_bf16_pair(p, out + col, acc[i].x * inv, acc[i].y * inv);
    store_bf16_pair(p, out + col + 2, acc[i].z * inv, acc[i].w * inv);
  }
  if (lane == 0 && p.lse != nullptr) p.lse[token * p.stride_lse_t + head * p.stride_lse_h] = (lse_max + log2f(sum)) * kLn2;
  if (lane == 0 && p.max_logits != nullptr) {
    p.max_logits[token * p.stride_max_t + head * p.stride_max_h] = logit_max * kLn2;
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
