// File: compressor.h
//
// The DeepSeek-V4 KV compressor (spec 1.7, 2.5, 2.6) for ratio 4 (overlapping
// windows) and ratio 128, writing either a layer's compressed attention cache
// (head dim 512) or the C4A indexer's key cache (head dim 128).
//
// Per step:
//  A. every token with a state slot saves its row [kv | score + ape[pos % r]]
//     (2 * coff * d f32, coff = 2 for r = 4, 1 for r = 128) into the paged
//     state cache;
//  B. a token with (pos + 1) % r == 0 and a compressed slot emits entry pos / r:
//     the coff * r state rows of positions pos - coff*r + 1 .. pos are pooled
//     per channel with a softmax over their scores (rows at negative positions
//     masked; with overlap the first r rows use the first half of each state
//     row, the rest the second half), RMS-normalized with the norm weight, the
//     last 64 dims rotated at position (pos / r) * r, and stored:
//       d = 512: NoPE dims unrotated, quantized per the cache format;
//       d = 128: all 128 dims rounded to bf16, one power-of-two scale per row.
// All of stage A completes before stage B, so an emission may read state rows
// written in the same step.
#pragma once

#include <cstdint>
#include <optional>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "smla/rope.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// State-cache geometry of a compressor: coff = 2 when windows overlap (r = 4).
constexpr int compressor_coff(int ratio) { return ratio == 4 ? 2 : 1; }
// f32 values per state row: [kv (coff*d) | score (coff*d)].
constexpr int compressor_state_width(int ratio, int head_dim) { return 2 * compressor_coff(ratio) * head_dim; }
// Tokens per state-cache block (spec 1.7): 4 for C4, 8 for C128.
constexpr int compressor_state_block_size(int ratio) { return ratio == 4 ? 4 : 8; }

struct CompressorArgs {
  int ratio = 4;                  // 4 or 128
  TensorView kv_score;            // [T, 2*coff*d] f32: kv (coff*d) then score (coff*d)
  TensorView ape;                 // [r, coff*d] f32, added to the score of position pos at ape[pos % r]
  TensorView norm_weight;         // [d] f32
  TensorView positions;           // [T] i32/i64 absolute positions inside each token's request
  TensorView token_to_request;    // [T] i32 row of the state block table
  TensorView state_cache;         // f32 [num_blocks, block_size, 2*coff*d]; block stride from stride[0]
  TensorView state_block_table;   // [R, max_blocks] i32: state slot of (req, pos) = bt[req][pos/bs]*bs + pos%bs
  TensorView state_slot_mapping;  // [T] i64, -1 = padding token (nothing saved or emitted); else must
                                  // equal the block-table slot of the token
  TensorView compressed_slot_mapping;  // [T] i64, -1 unless the token emits an entry
  const RopeTable* rope = nullptr;
  float eps = 1e-6f;
  // Exactly one destination: a 512-dim attention cache or a 128-dim indexer key cache.
  std::optional<KvCacheView> kv_cache;
  std::optional<IndexerCacheView> index_cache;
};

// On the context's backend (smla/layer.h, "Contexts and backends").
Status run_compressor(const Context& context, const CompressorArgs& args);
Status run_compressor(const CompressorArgs& args, Backend backend = Backend::kCpu);

}  // namespace smla
