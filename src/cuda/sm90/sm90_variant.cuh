// Internal: builds the AttentionVariant of the sm90 kernel for one row format
// (included by the per-format instantiation files only).
#pragma once

#include "src/cuda/sm90/sm90_attention.h"
#include "src/cuda/sm90/sm90_attention_kernel.cuh"

namespace smla::cuda::sm90 {

template <class Loader>
cudaError_t set_sm90_smem_limit(int smem_bytes) {
  return cudaFuncSetAttribute(sm90_attention_kernel<Loader>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

template <class Loader>
cudaError_t launch_sm90_attention(const SparseAttentionParams& params, dim3 grid, int smem_bytes, cudaStream_t stream) {
  const cudaError_t status = set_sm90_smem_limit<Loader>(smem_bytes);
  if (status != cudaSuccess) return status;
  sm90_attention_kernel<Loader><<<grid, kThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <class Loader>
cudaError_t sm90_attention_blocks_per_sm(int smem_bytes, int* blocks) {
  const cudaError_t status = set_sm90_smem_limit<Loader>(smem_bytes);
  if (status != cudaSuccess) return status;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, sm90_attention_kernel<Loader>, kThreads, smem_bytes);
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
