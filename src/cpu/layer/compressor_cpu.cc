// kCpu: the compressor in f32 (spec 1.7).
//
// Stage A (save_states) runs first on the calling thread; stage B then only
// reads the state cache, so emitting tokens run in parallel on the CPU
// backend's thread pool, each pooling its window in the same serial order
// whatever the thread count or chunking.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/cpu/thread_pool.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/compressor_state.h"
#include "src/cpu/layer/parallel_rows.h"
#include "src/cpu/layer/rope_f32.h"
#include "src/runtime/layer/indexer_cache_rows.h"

namespace smla::layer_detail {

using detail::read_index;

namespace {

struct PoolScratch {
  std::vector<const float*> kv_rows, score_rows;
  std::vector<float> row_max, denominator, pooled;
};

void compress_token(const CompressorArgs& args, const CompressorShape& shape, std::int64_t t, PoolScratch& scratch) {
  const int d = shape.head_dim;
  const int half = shape.coff * d;  // offset of the score part in a state row
  const std::int64_t window = static_cast<std::int64_t>(shape.coff) * shape.ratio;
  scratch.kv_rows.resize(static_cast<std::size_t>(window));
  scratch.score_rows.resize(static_cast<std::size_t>(window));
  scratch.row_max.assign(static_cast<std::size_t>(d), -std::numeric_limits<float>::infinity());
  scratch.denominator.assign(static_cast<std::size_t>(d), 0.0f);
  scratch.pooled.assign(static_cast<std::size_t>(d), 0.0f);
  float* row_max = scratch.row_max.data();
  float* denominator = scratch.denominator.data();
  float* pooled = scratch.pooled.data();
  const float* weight = args.norm_weight.ptr<const float>();
  const std::int64_t position = read_index(args.positions, t);
  const std::int64_t req = read_index(args.token_to_request, t);
  // Row j covers position - window + 1 + j; with overlap the first r rows are
  // the previous window and contribute the first half of their state.
  std::int64_t live = 0;
  for (std::int64_t j = 0; j < window; ++j) {
    const std::int64_t p = position - window + 1 + j;
    if (p < 0) continue;  // masked: score -inf, kv 0, i.e. no contribution
    const float* row = state_row(args, shape, state_slot(args, shape, req, p));
    const int column = (shape.coff == 2 && j < shape.ratio) ? 0 : (shape.coff - 1) * d;
    scratch.kv_rows[static_cast<std::size_t>(live)] = row + column;
    scratch.score_rows[static_cast<std::size_t>(live)] = row + half + column;
    ++live;
  }
  for (std::int64_t j = 0; j < live; ++j) {
    const float* s = scratch.score_rows[static_cast<std::size_t>(j)];
    for (int c = 0; c < d; ++c) row_max[c] = std::max(row_max[c], s[c]);
  }
  for (std::int64_t j = 0; j < live; ++j) {
    const float* s = scratch.score_rows[static_cast<std::size_t>(j)];
    const float* kv = scratch.kv_rows[static_cast<std::size_t>(j)];
    for (int c = 0; c < d; ++c) {
      const float w = std::exp(s[c] - row_max[c]);
      denominator[c] += w;
      pooled[c] += w * kv[c];
    }
  }
  float sum_squares = 0.0f;
  for (int c = 0; c < d; ++c) {
    pooled[c] /= denominator[c];
    sum_squares += pooled[c] * pooled[c];
  }
  const float inv_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(d) + args.eps);
  for (int c = 0; c < d; ++c) pooled[c] *= inv_rms * weight[c];
  const std::int64_t window_start = position / shape.ratio * shape.ratio;
  rotate_f32(pooled + d - kRopeDim, args.rope->row(window_start), RopeDirection::kForward);
  const std::int64_t slot = read_index(args.compressed_slot_mapping, t);
  if (args.kv_cache) {
    store_row_512(*args.kv_cache, slot, pooled);
  } else {
    encode_indexer_key(*args.index_cache, slot, pooled);
  }
}

}  // namespace

Status run_compressor_f32(const CompressorArgs& args, const CompressorShape& shape) {
  save_states(args, shape);
  const std::vector<bool> store = last_store_per_slot(
      shape.tokens, [&](std::int64_t t) { return emits(args, t) ? read_index(args.compressed_slot_mapping, t) : -1; });
  // A token whose store a later token overwrites computes nothing visible.
  std::vector<std::int64_t> emitting;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    if (store[static_cast<std::size_t>(t)]) emitting.push_back(t);
  }
  std::vector<PoolScratch> scratch(static_cast<std::size_t>(cpu::num_threads()));
  cpu::parallel_for(static_cast<std::int64_t>(emitting.size()), [&](std::int64_t item, int worker) {
    compress_token(args, shape, emitting[static_cast<std::size_t>(item)], scratch[static_cast<std::size_t>(worker)]);
  });
  return Status::Ok();
}

}  // namespace smla::layer_detail
