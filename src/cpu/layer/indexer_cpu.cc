// kCpu: the lightning indexer in f32.
//
// Top-k: each request's keys are decoded once (in parallel, dimension-major so
// the logit pass vectorizes over entries; requests in batches of bounded
// memory), then its tokens run in parallel on the CPU backend's thread pool,
// each with its own scratch. A token's logits are one
// fixed chain per entry (indexer_score.h), so results never depend on threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/cpu/thread_pool.h"
#include "src/core/strided_access.h"
#include "src/cpu/layer/indexer_score.h"
#include "src/cpu/layer/rope_f32.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {

namespace {

constexpr int kDim = kIndexerHeadDim;

// Logit order of the indexer: larger first, equal logits by smaller entry,
// NaN after every number. A strict total order, so the selected set is unique.
bool ranks_before(const float* logits, std::int32_t a, std::int32_t b) {
  const float la = logits[a];
  const float lb = logits[b];
  const bool nan_a = std::isnan(la), nan_b = std::isnan(lb);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && la != lb) return la > lb;
  return a < b;
}

// Keys of one request in dimension-major blocks (indexer_score.h) and the
// tokens of this call that read them.
struct RequestKeys {
  std::int64_t request = 0;
  std::int64_t entries = 0;  // the most any of its tokens can see
  std::vector<std::int64_t> tokens;
  std::vector<float> key_blocks;
};

struct TokenScratch {
  std::vector<float> query, head_weights, logits;
  std::vector<std::int32_t> order;
};

void prepare_query_token(const IndexerQueryArgs& args, const IndexerQueryShape& shape, float weight_scale,
                         std::int64_t t) {
  float row[kDim];
  const float* cos_sin = args.rope->row(read_index(args.positions, t));
  for (std::int64_t h = 0; h < shape.heads; ++h) {
    load_floats(args.q, t * args.q.stride[0] + h * args.q.stride[1], kDim, row);
    rotate_f32(row + kDim - kRopeDim, cos_sin, RopeDirection::kForward);
    float amax = 0.0f;
    for (int i = 0; i < kDim; ++i) {
      row[i] = round_to_bf16(row[i]);
      if (std::isfinite(row[i])) amax = std::max(amax, std::fabs(row[i]));
    }
    const int e = fp8_tile_exponent(amax);
    auto* codes = args.q_fp8.ptr<std::uint8_t>() + t * args.q_fp8.stride[0] + h * args.q_fp8.stride[1];
    for (int i = 0; i < kDim; ++i) codes[i] = f32_to_e4m3(std::ldexp(row[i], -e));
    const float w = args.weights.ptr<const float>()[t * args.weights.stride[0] + h * args.weights.stride[1]];
    args.head_weights.ptr<float>()[t * args.head_weights.stride[0] + h * args.head_weights.stride[1]] =
        w * std::ldexp(1.0f, e) * weight_scale;
  }
}

// Decodes the keys of requests[begin, end) in parallel chunks of kIndexerEntryBlock entries.
void decode_keys(const IndexerTopkArgs& args, std::vector<RequestKeys>& requests, std::size_t begin, std::size_t end) {
  struct Chunk {
    RequestKeys* keys;
    std::int64_t first;
  };
  std::vector<Chunk> chunks;
  for (std::size_t r = begin; r < end; ++r) {
    RequestKeys& request = requests[r];
    request.key_blocks.assign(static_cast<std::size_t>(kDim * indexer_padded_entries(request.entries)), 0.0f);
    for (std::int64_t j = 0; j < request.entries; j += kIndexerEntryBlock) chunks.push_back({&request, j});
  }
  const std::int64_t page = args.key_cache.page_size();
  cpu::parallel_for(static_cast<std::int64_t>(chunks.size()), [&](std::int64_t item, int) {
    const Chunk& chunk = chunks[static_cast<std::size_t>(item)];
    RequestKeys& request = *chunk.keys;
    const std::int64_t last = std::min(request.entries, chunk.first + kIndexerEntryBlock);
    float key[kDim];
    for (std::int64_t j = chunk.first; j < last; ++j) {
      const std::int64_t slot = read_table(args.block_table, request.request, j / page) * page + j % page;
      decode_indexer_key(args.key_cache, slot, key);
      for (int i = 0; i < kDim; ++i) request.key_blocks[static_cast<std::size_t>(indexer_key_offset(j, i))] = key[i];
    }
  });
}

void select_token(const IndexerTopkArgs& args, const IndexerTopkShape& shape, const RequestKeys* request,
                  std::int64_t t, TokenScratch& scratch) {
  std::int32_t* out = args.topk_indices.ptr<std::int32_t>() + t * args.topk_indices.stride[0];
  const std::int64_t entries = request ? (read_index(args.positions, t) + 1) / kIndexerRatio : 0;
  const std::int64_t kept = std::min(entries, shape.top_k);
  if (kept > 0) {
    scratch.query.resize(static_cast<std::size_t>(shape.heads * kDim));
    std::vector<float>& head_weights = scratch.head_weights;
    head_weights.resize(static_cast<std::size_t>(shape.heads));
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      const auto* codes = args.q_fp8.ptr<const std::uint8_t>() + t * args.q_fp8.stride[0] + h * args.q_fp8.stride[1];
      for (int i = 0; i < kDim; ++i) scratch.query[static_cast<std::size_t>(h * kDim + i)] = e4m3_to_f32(codes[i]);
      head_weights[static_cast<std::size_t>(h)] =
          args.head_weights.ptr<const float>()[t * args.head_weights.stride[0] + h * args.head_weights.stride[1]];
    }
    scratch.logits.resize(static_cast<std::size_t>(indexer_padded_entries(entries)));
    indexer_weighted_relu_logits(scratch.query.data(), head_weights.data(), shape.heads, request->key_blocks.data(),
                                 entries, scratch.logits.data());
    scratch.order.resize(static_cast<std::size_t>(entries));
    std::iota(scratch.order.begin(), scratch.order.end(), 0);
    if (kept < entries) {
      const float* logits = scratch.logits.data();
      std::nth_element(scratch.order.begin(), scratch.order.begin() + kept, scratch.order.end(),
                       [logits](std::int32_t a, std::int32_t b) { return ranks_before(logits, a, b); });
      std::sort(scratch.order.begin(), scratch.order.begin() + kept);
    }
    std::memcpy(out, scratch.order.data(), sizeof(std::int32_t) * static_cast<std::size_t>(kept));
  }
  for (std::int64_t k = std::max<std::int64_t>(kept, 0); k < shape.top_k; ++k) out[k] = -1;
}

}  // namespace

Status prepare_indexer_query_f32(const IndexerQueryArgs& args, const IndexerQueryShape& shape) {
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(kDim)) / std::sqrt(static_cast<float>(shape.heads));
  cpu::parallel_for(shape.tokens, [&](std::int64_t t, int) { prepare_query_token(args, shape, weight_scale, t); });
  return Status::Ok();
}

Status indexer_topk_f32(const IndexerTopkArgs& args, const IndexerTopkShape& shape) {
  return indexer_topk_f32_batched(args, shape, kIndexerKeyBatchBytes);
}

Status indexer_topk_f32_batched(const IndexerTopkArgs& args, const IndexerTopkShape& shape,
                                std::int64_t key_batch_bytes) {
  std::vector<TokenScratch> scratch(static_cast<std::size_t>(cpu::num_threads()));
  std::map<std::int64_t, std::size_t> index_of_request;
  std::vector<RequestKeys> requests;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t entries = (read_index(args.positions, t) + 1) / kIndexerRatio;
    if (entries <= 0) {
      select_token(args, shape, nullptr, t, scratch[0]);  // no entry yet: all -1
      continue;
    }
    const std::int64_t req = read_index(args.token_to_request, t);
    const auto [it, added] = index_of_request.emplace(req, requests.size());
    if (added) requests.push_back({req, 0, {}, {}});
    RequestKeys& request = requests[it->second];
    request.entries = std::max(request.entries, entries);
    request.tokens.push_back(t);
  }
  for (std::size_t begin = 0; begin < requests.size();) {
    std::size_t end = begin;
    std::int64_t bytes = 0;
    std::vector<std::pair<const RequestKeys*, std::int64_t>> tokens;
    while (end < requests.size() && (end == begin || bytes < key_batch_bytes)) {
      bytes += indexer_padded_entries(requests[end].entries) * kDim * static_cast<std::int64_t>(sizeof(float));
      for (std::int64_t t : requests[end].tokens) tokens.emplace_back(&requests[end], t);
      ++end;
    }
    decode_keys(args, requests, begin, end);
    cpu::parallel_for(static_cast<std::int64_t>(tokens.size()), [&](std::int64_t item, int worker) {
      const auto [request, t] = tokens[static_cast<std::size_t>(item)];
      select_token(args, shape, request, t, scratch[static_cast<std::size_t>(worker)]);
    });
    for (std::size_t r = begin; r < end; ++r) std::vector<float>().swap(requests[r].key_blocks);
    begin = end;
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
