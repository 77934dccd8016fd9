// kReference: the compressor's pooling, norm and rotation in float64 (spec 1.7).
#include <algorithm>
#include <cmath>
#include <vector>

#include "src/runtime/layer/cache_rows.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/compressor_state.h"
#include "src/runtime/layer/indexer_cache_rows.h"
#include "src/reference/layer/rope_f64.h"

namespace smla::layer_detail {

using detail::read_index;

Status run_compressor_f64(const CompressorArgs& args, const CompressorShape& shape) {
  save_states(args, shape);
  const int d = shape.head_dim;
  const std::int64_t r = shape.ratio;
  const std::int64_t window = shape.coff * r;
  const bool overlap = shape.coff == 2;
  std::vector<double> out(static_cast<std::size_t>(d));
  std::vector<float> rounded(static_cast<std::size_t>(d));
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    if (!emits(args, t)) continue;
    const std::int64_t position = read_index(args.positions, t);
    const std::int64_t req = read_index(args.token_to_request, t);
    for (int c = 0; c < d; ++c) {
      // Softmax over the window rows of channel c; rows before position 0 are
      // absent (score -inf, weight 0).
      double best = -INFINITY;
      for (std::int64_t j = 0; j < window; ++j) {
        const std::int64_t p = position - window + 1 + j;
        if (p < 0) continue;
        const float* row = state_row(args, shape, state_slot(args, shape, req, p));
        const std::int64_t channel = (overlap && j >= r) ? d + c : c;
        best = std::max(best, static_cast<double>(row[shape.coff * d + channel]));
      }
      double numerator = 0.0, denominator = 0.0;
      for (std::int64_t j = 0; j < window; ++j) {
        const std::int64_t p = position - window + 1 + j;
        if (p < 0) continue;
        const float* row = state_row(args, shape, state_slot(args, shape, req, p));
        const std::int64_t channel = (overlap && j >= r) ? d + c : c;
        const double weight = std::exp(static_cast<double>(row[shape.coff * d + channel]) - best);
        denominator += weight;
        numerator += weight * static_cast<double>(row[channel]);
      }
      out[static_cast<std::size_t>(c)] = numerator / denominator;
    }
    double mean_square = 0.0;
    for (int c = 0; c < d; ++c) mean_square += out[static_cast<std::size_t>(c)] * out[static_cast<std::size_t>(c)];
    mean_square /= d;
    const double scale = 1.0 / std::sqrt(mean_square + static_cast<double>(args.eps));
    const float* weight = args.norm_weight.ptr<const float>();
    for (int c = 0; c < d; ++c) out[static_cast<std::size_t>(c)] *= scale * static_cast<double>(weight[c]);
    rotate_f64(out.data() + d - kRopeDim, *args.rope, position / r * r, RopeDirection::kForward);
    for (int c = 0; c < d; ++c) rounded[static_cast<std::size_t>(c)] = static_cast<float>(out[static_cast<std::size_t>(c)]);
    const std::int64_t slot = read_index(args.compressed_slot_mapping, t);
    if (args.kv_cache) {
      store_row_512(*args.kv_cache, slot, rounded.data());
    } else {
      encode_indexer_key(*args.index_cache, slot, rounded.data());
    }
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
