// Internal: builds the AttentionVariant of the sm90 kernel for one row format
// (included by the per-format instantiation files only).
#pragma once

#include <cstdlib>
#include <string_view>

#include "src/cuda/sm90/sm90_attention.h"
#include "src/cuda/sm90/sm90_attention_kernel.cuh"

namespace smla::cuda::sm90 {

// SMLA_SM90_BLOCK_ORDER=grid keeps the launch's block order (head blocks of a
// token far apart); the default starts a token's head blocks together.
inline bool sm90_token_major_order() {
  const char* order = std::getenv("SMLA_SM90_BLOCK_ORDER");
  return order == nullptr || std::string_view(order) != "grid";
}

template <class Loader>
cudaError_t launch_sm90_attention(const SparseAttentionParams& params, dim3 grid, int smem_bytes, cudaStream_t stream) {
  const bool token_major = sm90_token_major_order();
  auto* kernel = token_major ? sm90_attention_kernel<Loader, true> : sm90_attention_kernel<Loader, false>;
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (status != cudaSuccess) return status;
  kernel<<<grid, kThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <class Loader>
cudaError_t sm90_attention_blocks_per_sm(int smem_bytes, int* blocks) {
  auto* kernel = sm90_attention_kernel<Loader, true>;
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (status != cudaSuccess) return status;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, smem_bytes);
}

// The sm90 kernel has no raw staging ring and always two K buffers: all of its
// shared memory is "fixed".
template <class Units>
AttentionVariant make_sm90_variant() {
  using Loader = Sm90RowLoader<Units>;
  return {kRows, Sm90Layout<Loader::kDim>::kDynamicBytes, 0, 0, &launch_sm90_attention<Loader>,
          &sm90_attention_blocks_per_sm<Loader>};
}

}  // namespace smla::cuda::sm90
