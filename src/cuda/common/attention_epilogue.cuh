// What the two CUDA attention kernels (the portable mma.sync kernel,
// sparse_attention_kernel.cuh, and the Hopper wgmma kernel,
// sm90/sm90_attention_kernel.cuh) and the split combine share: the Q load, the
// online-softmax row statistics and the epilogue that writes out / lse /
// max_logits (unsplit) or the split partials. Everything is forceinline and
// parameterised by what differs between the kernels: the row -> (token, head)
// map, the threads holding a softmax row, the accumulator register layout and
// the shared-memory layout of Q.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "src/cuda/common/ptx.cuh"
#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

// The templates below take the CTA's row map `rows`: rows.live(row) says whether
// row `row` of the tile is a real one (padding rows, past h_q or past the packed
// tokens, get zero Q and are never written out); rows.token(row) and
// rows.head(row), asked only of live rows, say which (token, head) it is.

// The rows of one token's block of heads: row r is head head0 + r.
struct HeadBlockRows {
  const SparseAttentionParams& p;
  int token_index;
  int head0;
  int rows = 1 << 30;  // the block's heads (sm90: p.head_block_rows); the tile's other rows are padding
  __device__ __forceinline__ bool live(int row) const { return row < rows && head0 + row < p.num_heads; }
  __device__ __forceinline__ int token(int /*row*/) const { return token_index; }
  __device__ __forceinline__ int head(int row) const { return head0 + row; }
};

// ---- Q load --------------------------------------------------------------

// The 8 values at `src` as one 16-byte unit, read value by value (rows not 16-byte aligned).
__device__ __forceinline__ uint4 load_unaligned_unit(const std::uint16_t* src) {
  std::uint32_t e[8];
  for (int j = 0; j < 8; ++j) e[j] = src[j];
  return make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16), e[6] | (e[7] << 16));
}

// The CTA's kRows query rows of kDim values into shared memory, one 16-byte unit
// (8 values) a step over kThreads threads: unit `unit` of row `row` goes to
// dst(row, unit) (16-byte aligned); padding rows become zeros. Aligned rows: kAsync, by cp.async (the caller commits and waits;
// all of a thread's units are in flight at once), else by 16-byte __ldg.
template <int kRows, int kDim, int kThreads, bool kAsync, class Rows, class Dst>
__device__ __forceinline__ void load_query_rows(const SparseAttentionParams& p, int thread, const Rows& rows, Dst dst) {
  constexpr int kUnitsPerRow = kDim / 8;
  for (int i = thread; i < kRows * kUnitsPerRow; i += kThreads) {
    const int row = i / kUnitsPerRow;
    const int unit = i % kUnitsPerRow;
    void* to = dst(row, unit);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (rows.live(row)) {
      const std::uint16_t* src = p.q + rows.token(row) * p.stride_q_t + rows.head(row) * p.stride_q_h + unit * 8;
      if (!p.q_aligned_16) {
        value = load_unaligned_unit(src);
      } else if constexpr (kAsync) {
        cp_async_16(to, src);
        continue;
      } else {
        value = __ldg(reinterpret_cast<const uint4*>(src));
      }
    }
    *reinterpret_cast<uint4*>(to) = value;
  }
}

// ---- Online softmax statistics ---------------------------------------------

// Max / sum over the kLanes consecutive lanes (a power of two) that hold one row.
template <int kLanes>
__device__ __forceinline__ float row_reduce_max(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  return value;
}
template <int kLanes>
__device__ __forceinline__ float row_reduce_sum(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  return value;
}

// The value exponents are taken against, exp2((s - reference) * scale_log2):
// the row max, or 0 for a row that has seen nothing (keeps -inf - -inf out).
__device__ __forceinline__ float exp2_reference(float row_max) { return row_max == -INFINITY ? 0.0f : row_max; }

// One tile's step of the online softmax for a row: row_max takes the tile's max
// (fmaxf skips NaN scores; their probabilities are NaN and make the sum NaN);
// alpha rescales what was accumulated against the old max.
struct RowRescale {
  float reference;  // of this tile's probabilities (exp2_reference of the new max)
  float alpha;      // exp2((old max - reference) * scale_log2)
};
__device__ __forceinline__ RowRescale advance_row_max(float& row_max, float tile_max, float scale_log2) {
  const float new_max = fmaxf(row_max, tile_max);
  const float reference = exp2_reference(new_max);
  const float alpha = exp2f((row_max - reference) * scale_log2);
  row_max = new_max;
  return {reference, alpha};
}

// Row statistics (docs/attention.md, non-finite values and overflow). m is the
// row's max raw dot product, l its sum of exp2((s - m) * scale_log2): l == 0 means
// nothing attended, a NaN l that a score was NaN (or +inf), which makes out, lse and
// max_logits NaN. Scaled values past f32 come out as +-inf, the output stays exact.

// e^(sink - scale m): 0 for an absent or -inf sink and inf for a +inf one, NaN
// for a NaN sink. scale m is clamped to finite values, which keeps inf - inf out
// and changes nothing else (its weight against a finite sink is 0 or inf either way).
__device__ __forceinline__ float sink_weight(const SparseAttentionParams& p, int head, float m) {
  if (p.sink == nullptr) return 0.0f;
  const float scaled_max = fminf(fmaxf(m * p.scale_log2, -FLT_MAX), FLT_MAX);
  return exp2f(p.sink[head * p.stride_sink] * kLog2e - scaled_max);
}

// The factor turning a row's accumulator into its output: 1 / (l + e^(sink - scale m)), 0 when empty.
__device__ __forceinline__ float row_output_factor(const SparseAttentionParams& p, int head, float m, float l) {
  return l == 0.0f ? 0.0f : 1.0f / (l + sink_weight(p, head, m));
}

// lse = scale m + ln l (sink excluded), +inf when nothing was attended.
__device__ __forceinline__ float row_lse(const SparseAttentionParams& p, float m, float l) {
  return l == 0.0f ? INFINITY : fmaf(log2f(l), kLn2, m * p.softmax_scale);
}

// max_logits = scale m, -inf when nothing was attended, NaN with a NaN sum.
__device__ __forceinline__ float row_max_logit(const SparseAttentionParams& p, float m, float l) {
  return l == 0.0f ? -INFINITY : (isnan(l) ? NAN : m * p.softmax_scale);
}

// ---- Writing rows ----------------------------------------------------------

// Where the splits of one (token, head) sit in the split planes (partial_sum /
// partial_max; times kValueDim in partial_out): split s at s * plane + row.
struct SplitRow {
  std::int64_t plane;
  std::int64_t row;
  __device__ __forceinline__ std::int64_t at(int split) const { return split * plane + row; }
};
__device__ __forceinline__ SplitRow split_row(const SparseAttentionParams& p, int token, int head) {
  return {static_cast<std::int64_t>(p.num_tokens) * p.num_heads, static_cast<std::int64_t>(token) * p.num_heads + head};
}
__device__ __forceinline__ std::int64_t partial_index(const SparseAttentionParams& p, int split, int token, int head) {
  return split_row(p, token, head).at(split);
}

__device__ __forceinline__ void store_bf16_pair(const SparseAttentionParams& p, std::uint16_t* at, float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  if (p.out_aligned_4) {
    *reinterpret_cast<__nv_bfloat162*>(at) = v;
  } else {
    at[0] = __bfloat16_as_ushort(v.x);
    at[1] = __bfloat16_as_ushort(v.y);
  }
}

// lse and max_logits of an unsplit row, where asked for.
__device__ __forceinline__ void write_row_logits(const SparseAttentionParams& p, int token, int head, float m, float l) {
  if (p.lse != nullptr) p.lse[token * p.stride_lse_t + head * p.stride_lse_h] = row_lse(p, m, l);
  if (p.max_logits != nullptr) p.max_logits[token * p.stride_max_t + head * p.stride_max_h] = row_max_logit(p, m, l);
}

// The statistics of a finished row: the split's sum and raw max (split launches), or lse and max_logits.
__device__ __forceinline__ void write_row_statistics(const SparseAttentionParams& p, int token, int head, int split,
                                                     float m, float l) {
  if (p.num_splits > 1) {
    const std::int64_t at = partial_index(p, split, token, head);
    p.partial_sum[at] = l;
    p.partial_max[at] = m;
  } else {
    write_row_logits(p, token, head, m, l);
  }
}

// By the one thread publishing a row (`row` of the tile): m and l into shared
// memory for the threads writing the row's columns, and its statistics if live.
template <class Rows>
__device__ __forceinline__ void publish_row_statistics(const SparseAttentionParams& p, int split, const Rows& rows,
                                                       int row, float m, float l, float* m_s, float* l_s) {
  m_s[row] = m;
  l_s[row] = l;
  if (rows.live(row)) write_row_statistics(p, rows.token(row), rows.head(row), split, m, l);
}

// A (token, head) row that attends nothing, written by one warp: a zero output
// row, lse +inf ("nothing to attend"), max_logits -inf.
__device__ __forceinline__ void write_unattended_row(const SparseAttentionParams& p, int token, int head, int lane) {
  std::uint16_t* out = p.out + token * p.stride_out_t + head * p.stride_out_h;
  for (int c = lane * 2; c < kValueDim; c += 64) store_bf16_pair(p, out + c, 0.0f, 0.0f);
  if (lane == 0) write_row_logits(p, token, head, -INFINITY, 0.0f);
}

// The same for one split of a split row: its statistics say "nothing" (sum 0),
// which the combine skips; the partial output is not written.
__device__ __forceinline__ void write_empty_split_row(const SparseAttentionParams& p, int token, int head, int split,
                                                      int lane) {
  if (p.num_splits == 1) {
    write_unattended_row(p, token, head, lane);
  } else if (lane == 0) {
    const std::int64_t at = partial_index(p, split, token, head);
    p.partial_sum[at] = 0.0f;
    p.partial_max[at] = -INFINITY;
  }
}

// Every live row of a CTA whose split has no keys (uniform over the CTA), a warp a row.
template <int kRows, int kThreads, class Rows>
__device__ __forceinline__ void write_empty_split_rows(const SparseAttentionParams& p, int split, int thread,
                                                       const Rows& rows) {
  for (int row = thread / 32; row < kRows; row += kThreads / 32) {
    if (rows.live(row)) write_empty_split_row(p, rows.token(row), rows.head(row), split, thread % 32);
  }
}

// One thread's columns of one output row: kTiles pairs at columns column + 8 n
// (n < kTiles), pair(n) the accumulator values (float2) of pair n. Split launches
// write the f32 partial normalised by the split's own sum (8-byte stores; nothing
// for a split that attended nothing), unsplit ones the bf16 output, where the sink
// joins the denominator only: out = sum e^s v / (e^sink + sum e^s).
template <int kTiles, class Pair>
__device__ __forceinline__ void write_output_columns(const SparseAttentionParams& p, int token, int head, int split,
                                                     float m, float l, int column, Pair pair) {
  if (p.num_splits > 1) {
    if (l == 0.0f) return;  // the combine skips splits that attended nothing (a NaN l is written)
    const float inv = 1.0f / l;
    float* out = p.partial_out + partial_index(p, split, token, head) * kValueDim + column;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const float2 v = pair(n);
      *reinterpret_cast<float2*>(out + 8 * n) = make_float2(v.x * inv, v.y * inv);
    }
  } else {
    const float inv = row_output_factor(p, head, m, l);
    std::uint16_t* out = p.out + token * p.stride_out_t + head * p.stride_out_h + column;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const float2 v = pair(n);
      store_bf16_pair(p, out + 8 * n, v.x * inv, v.y * inv);
    }
  }
}

// Writes a warp's m16n8 accumulator fragments: the C layout of mma.sync m16n8k16,
// and each warp's quarter of a wgmma m64nN accumulator (N / 8 fragments in a row).
// Fragment (mt, nt) covers rows first_row + 16 mt + [0, 16) and columns
// first_column + 8 nt + [0, 8); the lane holds rows lane / 4 (values 0, 1) and
// lane / 4 + 8 (values 2, 3), columns 2 (lane % 4) and + 1; value(mt, nt, i) reads
// value i of fragment (mt, nt). The rows' m and l come from row_max / row_sum
// (shared memory, published by publish_row_statistics).
template <int kRowTiles, int kColumnTiles, class Rows, class Value>
__device__ __forceinline__ void write_output_fragments(const SparseAttentionParams& p, int split, const Rows& rows,
                                                       int first_row, int first_column, int lane, const float* row_max,
                                                       const float* row_sum, Value value) {
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + 16 * mt + lane / 4 + 8 * half;
      if (!rows.live(row)) continue;
      write_output_columns<kColumnTiles>(p, rows.token(row), rows.head(row), split, row_max[row], row_sum[row],
                                         first_column + 2 * (lane % 4), [&](int nt) {
                                           return make_float2(value(mt, nt, 2 * half), value(mt, nt, 2 * half + 1));
                                         });
    }
  }
}

}  // namespace smla::cuda
