// kReference: the lightning indexer in float64 plain loops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/layer_ops.h"
#include "src/reference/layer/rope_f64.h"

namespace smla::layer_detail {

namespace {
constexpr int kDim = kIndexerHeadDim;
}  // namespace

Status prepare_indexer_query_f64(const IndexerQueryArgs& args, const IndexerQueryShape& shape) {
  const double weight_scale = 1.0 / std::sqrt(static_cast<double>(kDim) * static_cast<double>(shape.heads));
  double row[kDim];
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t position = read_index(args.positions, t);
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      load_floats(args.q, t * args.q.stride[0] + h * args.q.stride[1], kDim, row);
      rotate_f64(row + kDim - kRopeDim, *args.rope, position, RopeDirection::kForward);
      double amax = 0.0;
      for (int i = 0; i < kDim; ++i) {
        row[i] = static_cast<double>(round_to_bf16(static_cast<float>(row[i])));
        if (std::isfinite(row[i])) amax = std::max(amax, std::fabs(row[i]));
      }
      // Smallest power of two s with max(amax, 1e-4) / s <= 448.
      const double clamped = std::max(amax, 1e-4);
      int e = static_cast<int>(std::ceil(std::log2(clamped / 448.0)));
      if (std::ldexp(448.0, e - 1) >= clamped) --e;  // guard log2 rounding up at exact powers
      if (std::ldexp(448.0, e) < clamped) ++e;
      auto* codes = args.q_fp8.ptr<std::uint8_t>() + t * args.q_fp8.stride[0] + h * args.q_fp8.stride[1];
      for (int i = 0; i < kDim; ++i) codes[i] = f32_to_e4m3(static_cast<float>(std::ldexp(row[i], -e)));
      const double w = args.weights.ptr<const float>()[t * args.weights.stride[0] + h * args.weights.stride[1]];
      args.head_weights.ptr<float>()[t * args.head_weights.stride[0] + h * args.head_weights.stride[1]] =
          static_cast<float>(w * std::ldexp(1.0, e) * weight_scale);
    }
  }
  return Status::Ok();
}

Status indexer_topk_f64(const IndexerTopkArgs& args, const IndexerTopkShape& shape) {
  const std::int64_t page = args.key_cache.page_size();
  float key[kDim];
  std::vector<double> logits;
  std::vector<std::int32_t> order;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t entries = (read_index(args.positions, t) + 1) / kIndexerRatio;
    logits.assign(static_cast<std::size_t>(entries), 0.0);
    for (std::int64_t j = 0; j < entries; ++j) {
      const std::int64_t req = read_index(args.token_to_request, t);
      decode_indexer_key(args.key_cache, read_table(args.block_table, req, j / page) * page + j % page, key);
      double logit = 0.0;
      for (std::int64_t h = 0; h < shape.heads; ++h) {
        const auto* codes = args.q_fp8.ptr<const std::uint8_t>() + t * args.q_fp8.stride[0] + h * args.q_fp8.stride[1];
        double dot = 0.0;
        for (int i = 0; i < kDim; ++i) dot += static_cast<double>(e4m3_to_f32(codes[i])) * static_cast<double>(key[i]);
        const double w = args.head_weights.ptr<const float>()[t * args.head_weights.stride[0] + h * args.head_weights.stride[1]];
        logit += w * (dot > 0.0 ? dot : 0.0);
      }
      logits[static_cast<std::size_t>(j)] = logit;
    }
    // Stable sort by logit descending keeps equal logits in entry order; NaN last.
    order.resize(static_cast<std::size_t>(entries));
    for (std::int64_t j = 0; j < entries; ++j) order[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      const double la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      if (std::isnan(la) || std::isnan(lb)) return !std::isnan(la) && std::isnan(lb);
      return la > lb;
    });
    // Selected set, written in ascending entry order.
    std::vector<bool> selected(static_cast<std::size_t>(entries), false);
    for (std::int64_t k = 0; k < std::min<std::int64_t>(entries, shape.top_k); ++k) {
      selected[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])] = true;
    }
    std::int32_t* out = args.topk_indices.ptr<std::int32_t>() + t * args.topk_indices.stride[0];
    std::int64_t written = 0;
    for (std::int64_t j = 0; j < entries; ++j) {
      if (selected[static_cast<std::size_t>(j)]) out[written++] = static_cast<std::int32_t>(j);
    }
    for (; written < shape.top_k; ++written) out[written] = -1;
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
