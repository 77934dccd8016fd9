// Internal: the prepass of packed MTP attention. For every group of
// params.pack_tokens consecutive tokens it writes the deduplicated union of the
// group's keys, each with the mask of the tokens attending it, into the
// caller's workspace (params.pack_keys / params.pack_counts).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

// Shared memory the prepass needs for groups of `capacity` entries (0 when it cannot run).
std::size_t pack_union_smem_bytes(int capacity);

// Enqueues the prepass over num_tokens / pack_tokens groups. No host sync, no allocation.
cudaError_t launch_pack_union(const SparseAttentionParams& params, cudaStream_t stream);

}  // namespace smla::cuda
