// A paged compressor setup for tests: R requests with permuted state blocks and
// permuted destination pages, per-(request, position) projection rows, and a
// run() that builds one step's views for any list of (request, position).
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "smla/compressor.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla::layer_test {

struct CompressorRig {
  int ratio, head_dim, coff, width, requests, max_len;
  std::int64_t state_bs, state_blocks_per_req, page_size, pages_per_req;
  std::vector<float> projections;  // [R, max_len, width]
  Buffer<float> ape, norm;
  Buffer<float> state;
  Buffer<std::int32_t> state_table, dest_table;
  std::optional<OwnedKvCache> kv_cache;
  std::optional<OwnedIndexerCache> index_cache;
  const RopeTable* rope;

  CompressorRig(int ratio_, bool indexer, KvFormat format, int requests_, int max_len_, std::int64_t page_size_,
                const RopeTable* rope_, std::mt19937_64& rng)
      : ratio(ratio_), head_dim(indexer ? 128 : 512), coff(compressor_coff(ratio_)),
        width(compressor_state_width(ratio_, indexer ? 128 : 512)), requests(requests_), max_len(max_len_),
        state_bs(compressor_state_block_size(ratio_)), page_size(page_size_), rope(rope_) {
    state_blocks_per_req = (max_len + state_bs - 1) / state_bs;
    pages_per_req = (max_len / ratio + page_size - 1) / page_size + 1;
    projections.resize(static_cast<std::size_t>(requests) * max_len * width);
    fill_uniform(projections, rng, -2.0f, 2.0f);
    ape.reset(DType::kF32, {ratio, coff * head_dim});
    fill_uniform(ape.data, rng, -0.5f, 0.5f);
    norm.reset(DType::kF32, {head_dim});
    fill_uniform(norm.data, rng, 0.5f, 1.5f);
    state.reset(DType::kF32, {requests * state_blocks_per_req, state_bs, width}, kNaN);
    state_table.reset(DType::kI32, {requests, state_blocks_per_req});
    const auto state_order = permuted_pages(requests * state_blocks_per_req, rng);
    std::copy(state_order.begin(), state_order.end(), state_table.data.begin());
    dest_table.reset(DType::kI32, {requests, pages_per_req});
    const auto dest_order = permuted_pages(requests * pages_per_req, rng);
    std::copy(dest_order.begin(), dest_order.end(), dest_table.data.begin());
    if (indexer) {
      index_cache.emplace(requests * pages_per_req, page_size);
    } else {
      kv_cache.emplace(format, requests * pages_per_req, page_size);
    }
  }

  float* projection(int req, std::int64_t pos) {
    return projections.data() + (static_cast<std::size_t>(req) * max_len + static_cast<std::size_t>(pos)) * width;
  }
  std::int64_t state_slot(int req, std::int64_t pos) const {
    return state_table.data[static_cast<std::size_t>(req * state_blocks_per_req + pos / state_bs)] * state_bs +
           pos % state_bs;
  }
  std::int64_t entry_slot(int req, std::int64_t entry) const {
    return dest_table.data[static_cast<std::size_t>(req * pages_per_req + entry / page_size)] * page_size +
           entry % page_size;
  }

  Status run(const std::vector<std::pair<int, std::int64_t>>& tokens, Backend backend) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    Buffer<float> kv_score(DType::kF32, {n, width});
    Buffer<std::int64_t> positions(DType::kI64, {n}), state_slots(DType::kI64, {n}), comp_slots(DType::kI64, {n});
    Buffer<std::int32_t> to_req(DType::kI32, {n});
    for (std::int64_t t = 0; t < n; ++t) {
      const auto [req, pos] = tokens[static_cast<std::size_t>(t)];
      std::copy_n(projection(req, pos), width, kv_score.data.data() + t * width);
      positions.data[static_cast<std::size_t>(t)] = pos;
      to_req.data[static_cast<std::size_t>(t)] = req;
      state_slots.data[static_cast<std::size_t>(t)] = state_slot(req, pos);
      comp_slots.data[static_cast<std::size_t>(t)] = (pos + 1) % ratio == 0 ? entry_slot(req, pos / ratio) : -1;
    }
    CompressorArgs args;
    args.ratio = ratio;
    args.kv_score = kv_score.view;
    args.ape = ape.view;
    args.norm_weight = norm.view;
    args.positions = positions.view;
    args.token_to_request = to_req.view;
    args.state_cache = state.view;
    args.state_block_table = state_table.view;
    args.state_slot_mapping = state_slots.view;
    args.compressed_slot_mapping = comp_slots.view;
    args.rope = rope;
    if (kv_cache) args.kv_cache = kv_cache->view;
    if (index_cache) args.index_cache = index_cache->view;
    return run_compressor(args, backend);
  }

  const std::vector<std::uint8_t>& dest_bytes() const { return kv_cache ? kv_cache->bytes : index_cache->bytes; }
};

// Tokens [begin, end) of one request.
inline std::vector<std::pair<int, std::int64_t>> token_range(int req, std::int64_t begin, std::int64_t end) {
  std::vector<std::pair<int, std::int64_t>> tokens;
  for (std::int64_t p = begin; p < end; ++p) tokens.emplace_back(req, p);
  return tokens;
}

}  // namespace smla::layer_test
