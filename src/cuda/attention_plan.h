// Internal: how one attention call is laid out on the device (head tile,
// split count, workspace), derived from shapes and device properties only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/status.h"
#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {

struct AttentionPlan {
  AttentionVariant variant;
  int kv_stages = 1;
  int k_buffers = 1;
  int smem_bytes = 0;
  int head_blocks = 1;
  int num_splits = 1;
  std::size_t workspace_bytes = 0;
};

// num_keys = main width + extra width (the most keys any token can attend).
Expected<AttentionPlan> plan_attention(LoaderKind kind, std::int64_t num_tokens, std::int64_t num_heads,
                                       std::int64_t num_keys);

// Points the split partials of `params` into `workspace` (plan.workspace_bytes long).
void assign_workspace(const AttentionPlan& plan, void* workspace, SparseAttentionParams* params);

// Enqueues the attention kernel and, when split, the combine.
Status launch_planned_attention(const AttentionPlan& plan, SparseAttentionParams params, cudaStream_t stream);

}  // namespace smla::cuda
