// Split-KV combine: merges the normalised f32 partials of each (token, head)
// by their sums and raw maxima and adds the attention sink to the denominator.
// One CTA of four warps per head; each thread owns 4 of the 512 value columns, so
// the partials of 16 splits are in flight at once (a warp a head, 16 columns a
// lane, had 4: a 10-split row took three dependent rounds of loads from L2 after
// the statistics', and small batches have a warp or two an SM to hide them).
// Launched as a programmatic dependent of the attention grid on sm90+ (attention_plan.h).
#include <cuda_bf16.h>

#include <cmath>

#include "src/cuda/common/attention_epilogue.cuh"
#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {
namespace {

constexpr int kWarpsPerHead = 4;
constexpr int kThreadsPerHead = kWarpsPerHead * 32;
constexpr int kColumnsPerThread = kValueDim / kThreadsPerHead;
static_assert(kColumnsPerThread == 4, "one float4 of each split's partial a thread");
constexpr int kSplitsInFlight = 16;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__global__ void __launch_bounds__(kThreadsPerHead) split_combine_kernel(const __grid_constant__ SparseAttentionParams p) {
  const int token = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % 32;
  const SplitRow splits = split_row(p, token, head);

  // Split s holds the raw max m_s, the sum l_s of exp2((s - m_s) * scale_log2) and,
  // where l_s != 0, out_s = its accumulator / l_s. With M the largest m_s of the
  // splits that attended something, split s weighs w_s = l_s * exp2((m_s - M) *
  // scale_log2): every exponent is <= 0, so no lse overflow can creep in. A NaN
  // l_s (a NaN score in that split) makes the whole row NaN; l_s == 0 is a split
  // that attended nothing, skipped (its partial was never written).
  // Lane j of every warp reads the statistics of splits j and j + 32 together (the
  // same lines for the head's four warps), so they cost one round trip to L2 and
  // each warp has the weights in its own lanes.
  static_assert(kMaxSplits <= 64, "two splits per lane");
  wait_for_prior_grid();
  float l[2], m_split[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int s = lane + 32 * j;
    const bool present = s < p.num_splits;
    l[j] = present ? p.partial_sum[splits.at(s)] : 0.0f;
    m_split[j] = present ? p.partial_max[splits.at(s)] : -INFINITY;
  }
  const unsigned live[2] = {__ballot_sync(kFullMask, l[0] != 0.0f), __ballot_sync(kFullMask, l[1] != 0.0f)};
  std::uint16_t* out = p.out + token * p.stride_out_t + head * p.stride_out_h;
  if ((live[0] | live[1]) == 0u) {  // no split attended anything
    if (thread < 32) write_unattended_row(p, token, head, lane);
    return;
  }
  // A NaN split's max may be -inf (fmaxf skips NaN scores): its NaN l still counts.
  const float m = row_reduce_max<32>(fmaxf(l[0] != 0.0f ? m_split[0] : -INFINITY, l[1] != 0.0f ? m_split[1] : -INFINITY));
  const float reference = exp2_reference(m);  // -inf: only NaN splits (the sum is NaN anyway)
  float weight[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) weight[j] = l[j] != 0.0f ? l[j] * exp2f((m_split[j] - reference) * p.scale_log2) : 0.0f;
  const float sum = row_reduce_sum<32>(weight[0] + weight[1]);

  // Groups of kSplitsInFlight splits: their partial loads are independent of one
  // another, so they are in flight together. The sum runs over the splits in order.
  float4 acc = {};
  for (int first = 0; first < p.num_splits; first += kSplitsInFlight) {
    float4 v[kSplitsInFlight];
    float w[kSplitsInFlight];
#pragma unroll
    for (int g = 0; g < kSplitsInFlight; ++g) {
      const int s = first + g;
      const float lane_weight = __shfl_sync(kFullMask, s < 32 ? weight[0] : weight[1], s % 32);
      const bool attended = s < p.num_splits && ((live[s / 32 % 2] >> (s % 32)) & 1u) != 0u;
      w[g] = attended ? lane_weight : 0.0f;
      v[g] = attended ? reinterpret_cast<const float4*>(p.partial_out + splits.at(s) * kValueDim)[thread] : float4{};
    }
#pragma unroll
    for (int g = 0; g < kSplitsInFlight; ++g) {
      acc.x += w[g] * v[g].x;
      acc.y += w[g] * v[g].y;
      acc.z += w[g] * v[g].z;
      acc.w += w[g] * v[g].w;
    }
  }
  // The same finish as an unsplit row (sparse_attention_kernel.cuh): m and sum are the row's statistics.
  const float inv = row_output_factor(p, head, m, sum);
  const int col = kColumnsPerThread * thread;
  store_bf16_pair(p, out + col, acc.x * inv, acc.y * inv);
  store_bf16_pair(p, out + col + 2, acc.z * inv, acc.w * inv);
  if (thread == 0) write_row_logits(p, token, head, m, sum);
}

}  // namespace

cudaError_t launch_split_combine(const SparseAttentionParams& params, bool programmatic, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(params.num_tokens), static_cast<unsigned>(params.num_heads));
  config.blockDim = dim3(kThreadsPerHead);
  config.stream = stream;
  cudaLaunchAttribute chained{};
  chained.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chained.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic) {
    config.attrs = &chained;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, split_combine_kernel, params);
}

}  // namespace smla::cuda
