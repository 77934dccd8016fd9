// Internal: builds the AttentionVariant of the sm90 kernel for one row source
// (included by the generated per-row-source instantiation files only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "src/cuda/common/func_attributes.h"
#include "src/cuda/sm90/sm90_attention.h"
#include "src/cuda/sm90/sm90_attention_kernel.cuh"
#include "src/cuda/sm90/sm90_tensor_map.h"

namespace smla::cuda::sm90 {

inline constexpr int kMostPortableClusterCtas = 8;
static_assert(kConsumerThreads / 32 == kFoldMergingWarps, "the plan counts on the consumer warps merging");
static_assert(kRows == kPairedBlockRows, "a pair's blocks are whole tiles");

// The cluster of a launch: a token's two head blocks (a CTA pair, 1 x 2 x 1) or a
// block's splits merged in their cluster (1 x 1 x splits).
inline cudaLaunchAttribute cluster_of(unsigned head_blocks, unsigned splits) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = head_blocks;
  attribute.val.clusterDim.z = splits;
  return attribute;
}

// The non-copying kernel for a launch; `paired`: the two head blocks of a token as a CTA pair.
template <class Loader>
auto* direct_kernel(bool paired, bool token_major) {
  return paired ? sm90_attention_kernel<Loader, false, true>
                : (token_major ? sm90_attention_kernel<Loader, true, false> : sm90_attention_kernel<Loader, false, false>);
}

// Sets what a folded cluster of `ctas` CTAs needs of `kernel` (the non-portable
// size above 8); cudaErrorInvalidValue past kMostFoldedClusterCtas.
template <class Kernel>
cudaError_t allow_folded_cluster(Kernel* kernel, int ctas) {
  if (ctas > kMostFoldedClusterCtas) return cudaErrorInvalidValue;
  return ctas > kMostPortableClusterCtas ? ensure_large_clusters(kernel) : cudaSuccess;
}

template <class Loader>
cudaError_t launch_sm90_attention(const SparseAttentionParams& caller_params, dim3 grid, int smem_bytes,
                                  const LaunchFlags& flags, cudaStream_t stream) {
  // The plan packs tokens only for the portable kernel; this one's key requests assume it does not.
  if (caller_params.pack_tokens > 1) return cudaErrorInvalidValue;
  // Blocks of fewer heads: 16 or 32, and only in unpaired CTAs of the FP8 kernel (AttentionPlan::head_block_rows).
  const int block_rows = caller_params.head_block_rows;
  if (block_rows != kRows && (Loader::kCopiesRows || (block_rows != 16 && block_rows != 32))) return cudaErrorInvalidValue;
  SparseAttentionParams params = caller_params;
  encode_query_tensor_map(&params, Loader::kDim);
  params.out_by_tensor_map = false;  // the kernels' own choices, never the caller's
  params.fold_splits = false;
  if constexpr (Loader::kCopiesRows && Sm90Layout<Loader::kDim>::kHasOutputSlots) {
    if (flags.tensor_stores) encode_output_tensor_map(&params, flags.output_box_rows);
  }
  const std::int64_t blocks = static_cast<std::int64_t>(grid.x) * grid.y * grid.z;
  if constexpr (Loader::kCopiesRows) {
    // One CTA per block of `grid`, or at most flags.persistent_ctas CTAs looping over them.
    auto* kernel = flags.token_major ? sm90_alternating_kernel<Loader, true> : sm90_alternating_kernel<Loader, false>;
    // The output slots of tensor stores come on top of the plan's shared memory (which
    // leaves the L1 cache that much more room where they are not used).
    if constexpr (Sm90Layout<Loader::kDim>::kHasOutputSlots) {
      if (params.out_by_tensor_map) smem_bytes += Sm90Layout<Loader::kDim>::kCopyingBytes - Sm90Layout<Loader::kDim>::kBytes;
    }
    const cudaError_t status = ensure_dynamic_smem(kernel, smem_bytes);
    if (status != cudaSuccess) return status;
    if (blocks > std::numeric_limits<int>::max()) return cudaErrorInvalidConfiguration;  // the kernel counts in int
    const std::int64_t most = flags.persistent_ctas > 0 ? flags.persistent_ctas : blocks;
    const auto ctas = static_cast<unsigned>(std::min(blocks, most));
    const WorkGrid work{static_cast<int>(grid.x), static_cast<int>(grid.y), static_cast<int>(grid.z)};
    kernel<<<ctas, kThreads, smem_bytes, stream>>>(params, work);
    return trace_dump_after(cudaGetLastError(), ctas, true, stream);
  } else {
    // The two head blocks of an h_q 65..128 token run as a CTA pair that shares the expansion.
    const bool paired = runs_as_pairs(flags, static_cast<int>(grid.y), block_rows);
    auto* kernel = direct_kernel<Loader>(paired, flags.token_major);
    cudaError_t status = ensure_dynamic_smem(kernel, smem_bytes);
    if (status != cudaSuccess) return status;
    // The paired kernel has no merge (its registers have no room for it).
    if (flags.fold_splits && paired) return cudaErrorInvalidValue;
    params.fold_splits = flags.fold_splits && grid.z > 1;
    if (params.fold_splits) {
      status = allow_folded_cluster(kernel, static_cast<int>(grid.z));
      if (status != cudaSuccess) return status;
    }
    cudaLaunchAttribute attributes[2]{};
    unsigned count = 0;
    if (paired) attributes[count++] = cluster_of(2, 1);
    if (params.fold_splits) attributes[count++] = cluster_of(1, grid.z);
    if (flags.after_prepass) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count].val.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
    config.stream = stream;
    config.attrs = count > 0 ? attributes : nullptr;
    config.numAttrs = count;
    return trace_dump_after(cudaLaunchKernelEx(&config, kernel, params), blocks, false, stream);
  }
}

template <class Loader>
cudaError_t sm90_attention_blocks_per_sm(int smem_bytes, int* blocks) {
  auto* kernel = [] {
    if constexpr (Loader::kCopiesRows) {
      return sm90_alternating_kernel<Loader, true>;
    } else {
      return direct_kernel<Loader>(false, true);
    }
  }();
  const cudaError_t status = ensure_dynamic_smem(kernel, smem_bytes);
  if (status != cudaSuccess) return status;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, smem_bytes);
}

template <class Loader>
cudaError_t sm90_folded_clusters(int smem_bytes, int splits, int* clusters) {
  *clusters = 0;
  if constexpr (Loader::kCopiesRows) {
    return cudaSuccess;  // the copying kernel never folds
  } else {
    auto* kernel = direct_kernel<Loader>(false, true);
    if (splits > kMostFoldedClusterCtas) return cudaSuccess;
    cudaError_t status = ensure_dynamic_smem(kernel, smem_bytes);
    if (status == cudaSuccess) status = allow_folded_cluster(kernel, splits);
    if (status != cudaSuccess) return status;
    cudaLaunchAttribute cluster = cluster_of(1, static_cast<unsigned>(splits));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1, 1, static_cast<unsigned>(splits));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
    config.attrs = &cluster;
    config.numAttrs = 1;
    return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
  }
}

// The sm90 kernel has no raw staging ring and always two K buffers: all of its
// shared memory is "fixed".
template <class Units>
AttentionVariant make_sm90_variant() {
  using Loader = Sm90RowLoader<Units>;
  return {kRows, Sm90Layout<Loader::kDim>::kDynamicBytes, 0, 0, &launch_sm90_attention<Loader>,
          &sm90_attention_blocks_per_sm<Loader>, &sm90_folded_clusters<Loader>};
}

}  // namespace smla::cuda::sm90

namespace smla::cuda {

template <class Rows>
AttentionVariant sm90_attention_variant_of() {
  return sm90::make_sm90_variant<sm90::UnitsOf<Rows>>();
}

}  // namespace smla::cuda
