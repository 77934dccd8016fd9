// Internal: builds the AttentionVariant entries of one row source (included by
// the generated per-row-source instantiation files only).
#pragma once

#include "src/cuda/common/func_attributes.h"
#include "src/cuda/sm80/sparse_attention_kernel.cuh"
#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {

template <class Loader, int kRows>
cudaError_t set_smem_limit(int smem_bytes) {
  return ensure_dynamic_smem(sparse_attention_kernel<Loader, kRows>, smem_bytes);
}

template <class Loader, int kRows>
cudaError_t launch_attention(const SparseAttentionParams& params, dim3 grid, int smem_bytes, const LaunchFlags& /*flags*/,
                             cudaStream_t stream) {
  const cudaError_t status = set_smem_limit<Loader, kRows>(smem_bytes);
  if (status != cudaSuccess) return status;
  sparse_attention_kernel<Loader, kRows><<<grid, kAttentionThreads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <class Loader, int kRows>
cudaError_t attention_blocks_per_sm(int smem_bytes, int* blocks) {
  const cudaError_t status = set_smem_limit<Loader, kRows>(smem_bytes);
  if (status != cudaSuccess) return status;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, sparse_attention_kernel<Loader, kRows>,
                                                       kAttentionThreads, smem_bytes);
}

template <class Loader, int kRows>
AttentionVariant make_variant() {
  using Cfg = AttentionConfig<Loader, kRows>;
  return {kRows, Cfg::smem_bytes(0, 1), Cfg::kRawStageBytes, Cfg::kKBytes, &launch_attention<Loader, kRows>,
          &attention_blocks_per_sm<Loader, kRows>};
}

template <class Loader>
AttentionVariant make_variant_for_rows(int rows) {
  if (rows <= 16) return make_variant<Loader, 16>();
  if (rows <= 32) return make_variant<Loader, 32>();
  return make_variant<Loader, 64>();
}

template <class Rows>
AttentionVariant attention_variant_of(int rows) {
  return make_variant_for_rows<LoaderOf<Rows>>(rows);
}

}  // namespace smla::cuda
