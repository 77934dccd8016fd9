// File: indexer.h
//
// The C4A lightning indexer (spec 1.8): picks, per query token, the top-k
// compressed entries of its request that the sparse attention reads.
//
//  prepare_indexer_query: q [T, 64, 128] -> GPT-J RoPE on dims 64..127 at pos,
//    bf16 rounding, per (token, head) FP8 quantization with one power-of-two
//    scale s = 2^ceil(log2(max(amax, 1e-4) / 448)); the scale is folded into the
//    head weights: w_out = w * s * 128^-0.5 * 64^-0.5.
//  indexer_topk: logit[t, j] = sum_h w_out[t,h] * ReLU(q8[t,h] . k[j]) over the
//    causally valid entries j < (pos+1)/4 of the token's request; the k largest
//    as request-local entry numbers, padded with -1.
//
// Selection and order (deterministic, every backend): the k entries with the
// largest logits are selected; equal logits prefer the smaller entry number; a
// NaN logit ranks below every number. The selected entries are written in
// ascending entry order, so a row does not depend on how the logits ranked
// them, and equals the short-context fill whenever all entries fit. With the
// short-context shortcut (the batch's longest request has max_seq_len / 4 <= k)
// the logits are not computed and row t is 0, 1, ..., n_comp(t) - 1, then -1
// (spec 1.8).
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/indexer_cache.h"
#include "smla/rope.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

inline constexpr int kIndexerHeads = 64;
inline constexpr int kIndexerHeadDim = IndexerFp8Format::kHeadDim;  // 128
inline constexpr int kIndexerRatio = 4;

struct IndexerQueryArgs {
  TensorView q;             // [T, Hi, 128] f32 or bf16 (wq_b output of the indexer)
  TensorView weights;       // [T, Hi] f32 (weights_proj output)
  TensorView positions;     // [T] i32/i64
  const RopeTable* rope = nullptr;
  TensorView q_fp8;         // [T, Hi, 128] e4m3 (written)
  TensorView head_weights;  // [T, Hi] f32 (written): weights * q scale * softmax_scale * head_scale
};

// On the context's backend (smla/layer.h, "Contexts and backends").
Status prepare_indexer_query(const Context& context, const IndexerQueryArgs& args);
Status prepare_indexer_query(const IndexerQueryArgs& args, Backend backend = Backend::kCpu);

struct IndexerTopkArgs {
  TensorView q_fp8;             // [T, Hi, 128] e4m3
  TensorView head_weights;      // [T, Hi] f32
  IndexerCacheView key_cache;   // written by the indexer's compressor
  TensorView positions;         // [T] i32/i64
  TensorView token_to_request;  // [T] i32 row of block_table
  TensorView block_table;       // [R, max_blocks] i32: entry j -> bt[req][j/ps]*ps + j%ps (ps = key page size)
  std::int64_t max_seq_len = -1;  // shortcut test; -1 = derived from positions (max pos + 1)
  bool allow_short_context = true;
  TensorView topk_indices;      // [T, k] i32 (written): request-local entries, -1 padded
};

// On the context's backend. cuda: max_seq_len is ignored, the shortcut is
// taken per token (a token with (pos + 1) / 4 <= k entries gets the
// short-context fill), which gives the same rows as the host rule; scratch
// align256(T x capacity x 4) bytes, capacity = block_table columns x key page
// size (indexer_topk_workspace_size; 0 on the host backends).
Status indexer_topk(const Context& context, const IndexerTopkArgs& args);
Expected<std::size_t> indexer_topk_workspace_size(const Context& context, const IndexerTopkArgs& args);
Status indexer_topk(const IndexerTopkArgs& args, Backend backend = Backend::kCpu);

// topk[t, j] = j if j < (pos_t + 1) / 4 else -1 (the short-context fill).
Status fill_short_context_topk(const TensorView& positions, const TensorView& topk_indices);

}  // namespace smla
