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
  int pack_tokens = 1;    // > 1: packed MTP, this many tokens of one request per CTA
  int pack_capacity = 0;  // union entries per packed group (pack_tokens * num_keys)
  bool prefetch_rows = false;  // SparseAttentionParams::prefetch_rows
  // sm90+: the combine is launched as a programmatic dependent of the attention
  // grid, so its launch overlaps the attention tail (it waits for the results).
  bool chain_combine = false;
  std::size_t workspace_bytes = 0;
};

// num_keys = main width + extra width (the most keys any token can attend).
// queries_per_request (s_q, divides num_tokens) lets heads below 64 share a CTA
// with the same request's other tokens (SparseDecodeArgs::queries_per_request).
Expected<AttentionPlan> plan_attention(LoaderKind kind, std::int64_t num_tokens, std::int64_t num_heads,
                                       std::int64_t num_keys, std::int64_t queries_per_request = 1);

struct PackRule {
  int max_rows = 32;                 // g * num_heads stays within this many rows (<= 64)
  bool only_when_fewer_rows = true;  // tuned: pack only when it cuts the tile rows per token
};

// Tokens of one request packed into a CTA (1: none). g divides s_q, g * num_heads
// <= rule.max_rows, the group's union fits the prepass. Plain rule: the largest such
// g. Tuned rule (the default): the g with the fewest tile rows per token (16/32/64-row
// tiles), the larger g on ties, and only when that is fewer than unpacked: h 8 packs
// (half of a 16-row tile is padding unpacked), h 16 and 32 do not (measured on an
// H100: packing full 16-row tiles into 32-row ones was 0.89-1.19x unpacked).
int choose_pack_tokens(std::int64_t num_heads, std::int64_t num_keys, std::int64_t queries_per_request,
                       PackRule rule = {});

// Points the split partials and the packed union of `params` into `workspace` (plan.workspace_bytes long).
void assign_workspace(const AttentionPlan& plan, void* workspace, SparseAttentionParams* params);

// Enqueues the pack prepass when packed, the attention kernel and, when split, the combine.
Status launch_planned_attention(const AttentionPlan& plan, SparseAttentionParams params, cudaStream_t stream);

}  // namespace smla::cuda
