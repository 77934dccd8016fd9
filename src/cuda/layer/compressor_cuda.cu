// The cuda row of run_compressor (spec 1.7, 2.5, 2.6): two kernels on the caller's
// stream, so every state row of stage A is in memory before stage B reads it.
//   A. one block per token copies [kv | score + ape[pos % r]] into its state row;
//   B. one block per emitting token pools its window per channel (softmax over
//      the scores), RMS-normalizes with the norm weight, and warp 0 rotates the
//      last 64 dims at the window start and encodes the row into the destination.
// Stores to one slot keep the last token's, as in a serial run; an emission
// whose window reaches an out-of-range block-table entry is dropped.
#include <cmath>
#include <cstdint>
#include <string>

#include "src/runtime/layer/layer_ops.h"
#include "src/cuda/layer/layer_device.cuh"

namespace smla {
namespace {

using layer_cuda::IndexVectorRef;
using layer_cuda::kWarpSize;
using layer_cuda::load_index;
using layer_cuda::PagedCacheRef;
using layer_cuda::RopeFrequencies;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxWindow = 128;  // coff * ratio: 8 for C4, 128 for C128

struct CompressorParams {
  int ratio, coff;
  int half_width;  // coff * head_dim: the kv part of a state row, then the score part
  std::int64_t tokens;
  const float* kv_score;  // [T, 2 * half_width]
  std::int64_t stride_kv_score_t;
  const float* ape;  // [ratio, half_width]
  std::int64_t stride_ape;
  const float* norm_weight;  // [head_dim], contiguous
  IndexVectorRef positions, token_to_request, state_slots, compressed_slots;  // [T] each
  float* state;  // [num_state_blocks, state_block_size, 2 * half_width]
  std::int64_t stride_state_block, stride_state_row, state_block_size, num_state_blocks;
  const std::int32_t* block_table;  // [table_rows, table_columns] state blocks per request
  std::int64_t stride_table_row, stride_table_column, table_rows, table_columns;
  RopeFrequencies rope;
  float eps;
  PagedCacheRef destination;
};

// Block-wide: true when a later token u in (t, tokens) satisfies same_store(u).
template <class SameStore>
__device__ __forceinline__ bool later_token_stores(const CompressorParams& p, std::int64_t t, SameStore same_store) {
  bool later = false;
#pragma unroll 4
  for (std::int64_t u = t + 1 + threadIdx.x; u < p.tokens; u += blockDim.x) later |= same_store(u);
  return __syncthreads_or(later) != 0;
}

__global__ void __launch_bounds__(kThreads) save_states_kernel(const CompressorParams p) {
  const int half_width = p.half_width;
  const std::int64_t t = blockIdx.x;
  const std::int64_t slot = load_index(p.state_slots, t);
  const std::int64_t position = load_index(p.positions, t);
  if (slot < 0 || slot >= p.num_state_blocks * p.state_block_size || position < 0) return;
  if (later_token_stores(p, t, [&](std::int64_t u) { return load_index(p.state_slots, u) == slot; })) return;
  float* row = p.state + (slot / p.state_block_size) * p.stride_state_block +
               (slot % p.state_block_size) * p.stride_state_row;
  const float* in = p.kv_score + t * p.stride_kv_score_t;
  const float* ape = p.ape + (position % p.ratio) * p.stride_ape;
  for (int i = threadIdx.x; i < half_width; i += blockDim.x) {
    row[i] = in[i];
    row[half_width + i] = __fadd_rn(in[half_width + i], ape[i]);
  }
}

// Sum over the block of one value per thread; every thread gets the total.
__device__ __forceinline__ float block_sum(float x, float* partials) {
  x = layer_cuda::warp_sum(x);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (layer_cuda::lane_id() == 0) partials[warp] = x;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total = __fadd_rn(total, partials[w]);
  return total;
}

template <class Destination>
__global__ void __launch_bounds__(kThreads) emit_kernel(const CompressorParams p) {
  constexpr int kDim = Destination::kHeadDim;
  constexpr int kSlots = kDim / kWarpSize;
  __shared__ std::int64_t row_offset[kMaxWindow];  // state row of window row j, -1 before position 0
  __shared__ float pooled[kDim];
  __shared__ float partials[kWarps];

  const std::int64_t t = blockIdx.x;
  const std::int64_t state_slot = load_index(p.state_slots, t);
  const std::int64_t slot = load_index(p.compressed_slots, t);
  const std::int64_t position = load_index(p.positions, t);
  // A token whose own state row was not saved (stage A skipped it) emits nothing either.
  if (state_slot < 0 || state_slot >= p.num_state_blocks * p.state_block_size || slot < 0 ||
      slot >= p.destination.num_slots || position < 0 || (position + 1) % p.ratio != 0) {
    return;
  }
  if (later_token_stores(p, t, [&](std::int64_t u) {
        return load_index(p.compressed_slots, u) == slot && load_index(p.state_slots, u) >= 0;
      })) {
    return;
  }
  const std::int64_t request = load_index(p.token_to_request, t);
  if (request < 0 || request >= p.table_rows) return;
  const int window = p.coff * p.ratio;
  bool bad_row = false;
  for (int j = threadIdx.x; j < window; j += blockDim.x) {
    const std::int64_t pos_j = position - window + 1 + j;
    std::int64_t offset = -1;
    if (pos_j >= 0) {
      const std::int64_t column = pos_j / p.state_block_size;
      const std::int64_t block =
          column < p.table_columns ? p.block_table[request * p.stride_table_row + column * p.stride_table_column] : -1;
      if (block < 0 || block >= p.num_state_blocks) {
        bad_row = true;
      } else {
        offset = block * p.stride_state_block + (pos_j % p.state_block_size) * p.stride_state_row;
      }
    }
    row_offset[j] = offset;
  }
  if (__syncthreads_or(bad_row)) return;

  // Row j of the window covers position - window + 1 + j; with overlap the
  // first r rows belong to the previous window and give the first half.
  const int score_offset = p.coff * kDim;
  float squares = 0.0f;
  for (int c = threadIdx.x; c < kDim; c += blockDim.x) {
    float row_max = -INFINITY;
    for (int j = 0; j < window; ++j) {
      if (row_offset[j] < 0) continue;
      const int column = (p.coff == 2 && j < p.ratio) ? 0 : (p.coff - 1) * kDim;
      row_max = fmaxf(row_max, p.state[row_offset[j] + score_offset + column + c]);
    }
    float denominator = 0.0f, numerator = 0.0f;
    for (int j = 0; j < window; ++j) {
      if (row_offset[j] < 0) continue;
      const int column = (p.coff == 2 && j < p.ratio) ? 0 : (p.coff - 1) * kDim;
      const float* row = p.state + row_offset[j] + column + c;
      const float w = expf(__fsub_rn(row[score_offset], row_max));
      denominator = __fadd_rn(denominator, w);
      numerator = __fadd_rn(numerator, __fmul_rn(w, row[0]));
    }
    const float value = __fdiv_rn(numerator, denominator);
    pooled[c] = value;
    squares = __fadd_rn(squares, __fmul_rn(value, value));
  }
  const float sum_squares = block_sum(squares, partials);  // synchronizes: pooled is complete
  if (threadIdx.x >= kWarpSize) return;

  const float inv_rms =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_squares, static_cast<float>(kDim)), p.eps)));
  const int lane = layer_cuda::lane_id();
  float v[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int c = k * kWarpSize + lane;
    v[k] = __fmul_rn(pooled[c], __fmul_rn(inv_rms, p.norm_weight[c]));
  }
  const std::int64_t window_start = position < p.rope.max_positions ? position / p.ratio * p.ratio : -1;
  layer_cuda::rotate_warp_row<kSlots, kSlots - kRopeDim / kWarpSize>(v, layer_cuda::warp_rope(p.rope, window_start));
  if constexpr (kDim == IndexerFp8Format::kHeadDim) {
    layer_cuda::warp_store_indexer_key(v, p.destination, slot);
  } else {
    layer_cuda::warp_store_row_512<Destination>(v, p.destination, slot);
  }
}

// The device-only limits (the front end checked the rest).
Status check_launch(const Context& context, const CompressorArgs& args, const layer_cuda::CompressorShape& shape) {
  if (shape.tokens > layer_cuda::kMaxGridX) {
    return invalid_argument("kv_score", "at most 2^31-1 tokens", std::to_string(shape.tokens));
  }
  const TensorView& destination = args.kv_cache ? args.kv_cache->pages : args.index_cache->pages;
  return layer_cuda::check_on_context_device(context, {{&args.kv_score, "kv_score"},
                                                       {&args.ape, "ape"},
                                                       {&args.norm_weight, "norm_weight"},
                                                       {&args.positions, "positions"},
                                                       {&args.token_to_request, "token_to_request"},
                                                       {&args.state_cache, "state_cache"},
                                                       {&args.state_block_table, "state_block_table"},
                                                       {&args.state_slot_mapping, "state_slot_mapping"},
                                                       {&args.compressed_slot_mapping, "compressed_slot_mapping"},
                                                       {&destination, args.kv_cache ? "kv_cache" : "index_cache"}});
}

}  // namespace

Status layer_cuda::run_compressor(const Context& context, const CompressorArgs& args, const CompressorShape& shape,
                                  void*) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  CompressorParams p{};
  p.ratio = args.ratio;
  p.coff = compressor_coff(args.ratio);
  p.half_width = p.coff * (args.kv_cache ? V4Fp8Format::kHeadDim : IndexerFp8Format::kHeadDim);
  p.tokens = args.kv_score.shape[0];
  p.kv_score = args.kv_score.ptr<const float>();
  p.stride_kv_score_t = args.kv_score.stride[0];
  p.ape = args.ape.ptr<const float>();
  p.stride_ape = args.ape.stride[0];
  p.norm_weight = args.norm_weight.ptr<const float>();
  p.positions = layer_cuda::index_vector(args.positions);
  p.token_to_request = layer_cuda::index_vector(args.token_to_request);
  p.state_slots = layer_cuda::index_vector(args.state_slot_mapping);
  p.compressed_slots = layer_cuda::index_vector(args.compressed_slot_mapping);
  p.state = args.state_cache.ptr<float>();
  p.stride_state_block = args.state_cache.stride[0];
  p.stride_state_row = args.state_cache.stride[1];
  p.state_block_size = args.state_cache.shape[1];
  p.num_state_blocks = args.state_cache.shape[0];
  p.block_table = args.state_block_table.ptr<const std::int32_t>();
  p.stride_table_row = args.state_block_table.stride[0];
  p.stride_table_column = args.state_block_table.stride[1];
  p.table_rows = args.state_block_table.shape[0];
  p.table_columns = args.state_block_table.shape[1];
  p.rope = layer_cuda::rope_frequencies(*args.rope, RopeDirection::kForward);
  p.eps = args.eps;
  p.destination = args.kv_cache ? layer_cuda::paged_cache(*args.kv_cache) : layer_cuda::paged_cache(*args.index_cache);
  if (p.tokens == 0) return Status::Ok();

  const auto s = static_cast<cudaStream_t>(context.stream());
  const auto blocks = static_cast<unsigned>(p.tokens);
  save_states_kernel<<<blocks, kThreads, 0, s>>>(p);
  if (args.kv_cache) {
    layer_cuda::visit_row_512_format(args.kv_cache->format, [&](auto format) {
      emit_kernel<decltype(format)><<<blocks, kThreads, 0, s>>>(p);
    });
  } else {
    emit_kernel<IndexerFp8Format><<<blocks, kThreads, 0, s>>>(p);
  }
  return layer_cuda::launch_status();
}

}  // namespace smla
