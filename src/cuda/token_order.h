// Internal: the longest-first token order of an sm90 FP8 decode grid
// (SparseAttentionParams::token_order). The hardware starts a grid's CTAs in
// index order as SMs free up; with random lengths a long token started in the
// last wave sets the grid's end (CONFIG3 b = 128: 28% of the time, docs/PERF.md,
// session 31). Run longest first, the last wave holds the short tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

// Workspace bytes of the order of `num_tokens` tokens (a multiple of 256).
std::size_t token_order_bytes(std::int64_t num_tokens);

// Enqueues one CTA that writes into `order` (num_tokens ints) a permutation of
// the tokens of `params`, ordered by their key tiles of `tile_keys` keys, most
// first (counts of 1023 tiles and more share one place), from the length values
// on the device, so a captured graph follows each replay's lengths. Tokens of
// equal counts keep their order within a warp's 32 (a request's MTP tokens stay
// together); across warps they may come in any order.
cudaError_t launch_token_order(const SparseAttentionParams& params, int tile_keys, int* order, cudaStream_t stream);

}  // namespace smla::cuda
