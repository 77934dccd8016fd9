// Internal (kCpu): the lightning indexer's logit pass, vectorized with Highway.
#pragma once

#include <cstdint>

#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {

// Keys are stored in blocks of this many entries, each block dimension-major
// ([128][kIndexerEntryBlock], 32 KiB): the rows a logit pass walks are then
// contiguous, not a power-of-two stride apart (which thrashes cache sets).
inline constexpr std::int64_t kIndexerEntryBlock = 64;

inline std::int64_t indexer_padded_entries(std::int64_t entries) {
  return (entries + kIndexerEntryBlock - 1) / kIndexerEntryBlock * kIndexerEntryBlock;
}

inline std::int64_t indexer_key_offset(std::int64_t entry, int dim) {
  return (entry / kIndexerEntryBlock) * (kIndexerEntryBlock * 128) + dim * kIndexerEntryBlock +
         entry % kIndexerEntryBlock;
}

// logits[j] = sum_h head_weights[h] * ReLU(query[h] . key_j) for j < entries,
// heads summed in order and each dot product accumulated over dims 0..127 in
// order (one fixed chain per entry, so a token's logits never depend on
// threads). key_blocks holds indexer_padded_entries(entries) / kIndexerEntryBlock
// blocks: dim i of entry j at indexer_key_offset(j, i). logits must hold
// indexer_padded_entries(entries).
// ReLU maps NaN to 0 like the float64 reference (`dot > 0 ? dot : 0`).
void indexer_weighted_relu_logits(const float* query, const float* head_weights, std::int64_t heads,
                                  const float* key_blocks, std::int64_t entries, float* logits);

// Decoded keys held at once by the kCpu top-k: requests are processed in
// batches of about this many bytes (at least one request each), so a decode
// step over many long requests never holds every request's keys together.
inline constexpr std::int64_t kIndexerKeyBatchBytes = std::int64_t{64} << 20;

// indexer_topk_f32 with another batch size (tests: 1 = one request per batch).
// Same preconditions as indexer_topk_f32 (validated arguments).
Status indexer_topk_f32_batched(const IndexerTopkArgs& args, const IndexerTopkShape& shape,
                                std::int64_t key_batch_bytes);

}  // namespace smla::layer_detail
