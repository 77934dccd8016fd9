// The longest-first token order (token_order.h): a counting sort in one CTA.
#include "src/cuda/token_order.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/sm80/sparse_attention_kernel.cuh"

namespace smla::cuda {
namespace {

constexpr int kOrderThreads = 1024;
constexpr int kOrderBins = kOrderThreads;  // one bin a thread in the scan
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

// The place of a token's tile count: most tiles first.
__device__ int order_bin(const SparseAttentionParams& p, int tile_keys, int token) {
  const int tiles = (token_key_counts(p, token).n_keys + tile_keys - 1) / tile_keys;
  return kOrderBins - 1 - min(tiles, kOrderBins - 1);
}

__device__ int inclusive_warp_sum(int value, int lane) {
#pragma unroll
  for (int delta = 1; delta < 32; delta *= 2) {
    const int below = __shfl_up_sync(kFullWarp, value, delta);
    if (lane >= delta) value += below;
  }
  return value;
}

__global__ void __launch_bounds__(kOrderThreads) token_order_kernel(const __grid_constant__ SparseAttentionParams p,
                                                                    int tile_keys, int* order) {
  __shared__ int next[kOrderBins];  // counts, then each bin's next free place
  __shared__ int warp_sums[kOrderThreads / 32];
  allow_dependent_launch();  // the attention grid's CTAs become resident meanwhile (they wait for the order)
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  next[tid] = 0;
  __syncthreads();
  for (int token = tid; token < p.num_tokens; token += kOrderThreads) atomicAdd(&next[order_bin(p, tile_keys, token)], 1);
  __syncthreads();

  // Exclusive prefix sum of the counts: where each bin's tokens start.
  const int count = next[tid];
  const int in_warp = inclusive_warp_sum(count, lane);
  if (lane == 31) warp_sums[warp] = in_warp;
  __syncthreads();
  if (warp == 0) warp_sums[lane] = inclusive_warp_sum(warp_sums[lane], lane);
  __syncthreads();
  next[tid] = in_warp - count + (warp > 0 ? warp_sums[warp - 1] : 0);
  __syncthreads();

  // Each warp's tokens of one bin take consecutive places, in token order.
  for (int base = 0; base < p.num_tokens; base += kOrderThreads) {
    const int token = base + tid;
    const int bin = token < p.num_tokens ? order_bin(p, tile_keys, token) : -1;
    const unsigned same = __match_any_sync(kFullWarp, bin);
    if (bin < 0) continue;
    const int leader = __ffs(static_cast<int>(same)) - 1;
    int first = 0;
    if (lane == leader) first = atomicAdd(&next[bin], __popc(same));
    first = __shfl_sync(same, first, leader);
    order[first + __popc(same & ((1u << lane) - 1u))] = token;
  }
}

}  // namespace

std::size_t token_order_bytes(std::int64_t num_tokens) {
  return (static_cast<std::size_t>(num_tokens) * sizeof(int) + 255) / 256 * 256;
}

cudaError_t launch_token_order(const SparseAttentionParams& params, int tile_keys, int* order, cudaStream_t stream) {
  if (params.num_tokens <= 0 || tile_keys <= 0 || order == nullptr) return cudaErrorInvalidValue;
  token_order_kernel<<<1, kOrderThreads, 0, stream>>>(params, tile_keys, order);
  return cudaGetLastError();
}

}  // namespace smla::cuda
