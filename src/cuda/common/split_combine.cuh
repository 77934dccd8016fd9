// Internal: merging the split partials of one (token, head) row, shared by the
// split combine kernel (split_combine.cu) and the sm90 kernel's CTAs that fold
// their cluster's splits (SparseAttentionParams::fold_splits).
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "src/cuda/common/attention_epilogue.cuh"

namespace smla::cuda {

// One warp merges the num_splits partials of row (token, head) (`splits`:
// split_row(p, token, head)) into its bf16 output, lse and max_logits, the sink
// added to the denominator. With kColumnParts warps a row, warp `column_part` of
// them merges that share of the 512 value columns (each lane 16 / kColumnParts,
// the statistics read by each), and each lane has the partials of kSplitsInFlight
// splits in flight at once (16 / kColumnParts registers a split).
// The partials must be visible to the warp: the grid before, or the cluster's
// barrier, whose acquire orders these plain loads after the other CTAs' released
// writes. (Loads from L2 by ld.global.cg measured 2-4 us slower in the combine
// kernel at b = 2, docs/PERF.md, session 37.)
template <int kSplitsInFlight, int kColumnParts = 1>
__device__ __forceinline__ void combine_split_row(const SparseAttentionParams& p, const SplitRow& splits, int token,
                                                  int head, int lane, int column_part = 0) {
  constexpr unsigned kFullMask = 0xFFFFFFFFu;
  constexpr int kVectors = kValueDim / 4 / 32 / kColumnParts;  // float4 columns a lane
  static_assert(kVectors * 4 * 32 * kColumnParts == kValueDim, "whole float4 columns a lane");
  const int first_vector = column_part * kVectors * 32 + lane;  // then every 32nd

  // Split s holds the raw max m_s, the sum l_s of exp2((s - m_s) * scale_log2) and,
  // where l_s != 0, out_s = its accumulator / l_s. With M the largest m_s of the
  // splits that attended something, split s weighs w_s = l_s * exp2((m_s - M) *
  // scale_log2): every exponent is <= 0, so no lse overflow can creep in. A NaN
  // l_s (a NaN score in that split) makes the whole row NaN; l_s == 0 is a split
  // that attended nothing, skipped (its partial was never written).
  // Lane j reads the statistics of splits j and j + 32 together, so the statistics
  // cost one round trip to L2 rather than a dependent pair per split.
  static_assert(kMaxSplits <= 64, "two splits per lane");
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
    if (column_part == 0) write_unattended_row(p, token, head, lane);
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
  // another, so they are in flight together.
  float4 acc[kVectors] = {};
  for (int first = 0; first < p.num_splits; first += kSplitsInFlight) {
    float4 v[kSplitsInFlight][kVectors];
    float w[kSplitsInFlight];
#pragma unroll
    for (int g = 0; g < kSplitsInFlight; ++g) {
      const int s = first + g;
      const float lane_weight = __shfl_sync(kFullMask, s < 32 ? weight[0] : weight[1], s % 32);
      // (A select, not live[s / 32]: a dynamic index would put the pair in local memory.)
      const bool attended = s < p.num_splits && (((s < 32 ? live[0] : live[1]) >> (s % 32)) & 1u) != 0u;
      w[g] = attended ? lane_weight : 0.0f;
      const float4* part = reinterpret_cast<const float4*>(p.partial_out + splits.at(s) * kValueDim);
#pragma unroll
      for (int i = 0; i < kVectors; ++i) v[g][i] = attended ? part[first_vector + 32 * i] : float4{};
    }
#pragma unroll
    for (int g = 0; g < kSplitsInFlight; ++g) {
#pragma unroll
      for (int i = 0; i < kVectors; ++i) {
        acc[i].x += w[g] * v[g][i].x;
        acc[i].y += w[g] * v[g][i].y;
        acc[i].z += w[g] * v[g][i].z;
        acc[i].w += w[g] * v[g][i].w;
      }
    }
  }
  // The same finish as an unsplit row (sparse_attention_kernel.cuh): m and sum are the row's statistics.
  const float inv = row_output_factor(p, head, m, sum);
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int col = 4 * (first_vector + 32 * i);
    store_bf16_pair(p, out + col, acc[i].x * inv, acc[i].y * inv);
    store_bf16_pair(p, out + col + 2, acc[i].z * inv, acc[i].w * inv);
  }
  if (lane == 0 && column_part == 0) write_row_logits(p, token, head, m, sum);
}

}  // namespace smla::cuda
