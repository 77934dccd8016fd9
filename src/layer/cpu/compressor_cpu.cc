// kCpu: the compressor in f32 (spec 1.7).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/layer/cache_rows.h"
#include "src/layer/compressor_state.h"
#include "src/layer/cpu/rope_f32.h"
#include "src/layer/indexer_cache_rows.h"

namespace smla::layer_detail {

Status run_compressor_f32(const CompressorArgs& args, const CompressorShape& shape) {
  save_states(args, shape);
  const int d = shape.head_dim;
  const int half = shape.coff * d;  // offset of the score part in a state row
  const std::int64_t window = static_cast<std::int64_t>(shape.coff) * shape.ratio;
  std::vector<const float*> kv_rows(static_cast<std::size_t>(window));
  std::vector<const float*> score_rows(static_cast<std::size_t>(window));
  std::vector<float> row_max(static_cast<std::size_t>(d)), denominator(static_cast<std::size_t>(d)),
      pooled(static_cast<std::size_t>(d));
  const float* weight = args.norm_weight.ptr<const float>();
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    if (!emits(args, t)) continue;
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
      kv_rows[static_cast<std::size_t>(live)] = row + column;
      score_rows[static_cast<std::size_t>(live)] = row + half + column;
      ++live;
    }
    for (int c = 0; c < d; ++c) row_max[static_cast<std::size_t>(c)] = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < live; ++j) {
      const float* s = score_rows[static_cast<std::size_t>(j)];
      for (int c = 0; c < d; ++c) row_max[static_cast<std::size_t>(c)] = std::max(row_max[static_cast<std::size_t>(c)], s[c]);
    }
    std::fill(denominator.begin(), denominator.end(), 0.0f);
    std::fill(pooled.begin(), pooled.end(), 0.0f);
    for (std::int64_t j = 0; j < live; ++j) {
      const float* s = score_rows[static_cast<std::size_t>(j)];
      const float* kv = kv_rows[static_cast<std::size_t>(j)];
      for (int c = 0; c < d; ++c) {
        const float w = std::exp(s[c] - row_max[static_cast<std::size_t>(c)]);
        denominator[static_cast<std::size_t>(c)] += w;
        pooled[static_cast<std::size_t>(c)] += w * kv[c];
      }
    }
    float sum_squares = 0.0f;
    for (int c = 0; c < d; ++c) {
      pooled[static_cast<std::size_t>(c)] /= denominator[static_cast<std::size_t>(c)];
      sum_squares += pooled[static_cast<std::size_t>(c)] * pooled[static_cast<std::size_t>(c)];
    }
    const float inv_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(d) + args.eps);
    for (int c = 0; c < d; ++c) pooled[static_cast<std::size_t>(c)] *= inv_rms * weight[c];
    const std::int64_t window_start = position / shape.ratio * shape.ratio;
    rotate_f32(pooled.data() + d - kRopeDim, args.rope->row(window_start), RopeDirection::kForward);
    const std::int64_t slot = read_index(args.compressed_slot_mapping, t);
    if (args.kv_cache) {
      store_row_512(*args.kv_cache, slot, pooled.data());
    } else {
      encode_indexer_key(*args.index_cache, slot, pooled.data());
    }
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
