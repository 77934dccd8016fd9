// kCpu: the lightning indexer in f32; logits through OpenBLAS sgemm.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/layer/checks.h"
#include "src/layer/cpu/rope_f32.h"
#include "src/layer/layer_backend.h"

namespace smla::layer_detail {

namespace {

constexpr int kDim = kIndexerHeadDim;

// Logit order of the indexer: larger first, equal logits by smaller entry,
// NaN after every number.
bool ranks_before(const std::vector<float>& logits, std::int32_t a, std::int32_t b) {
  const float la = logits[static_cast<std::size_t>(a)];
  const float lb = logits[static_cast<std::size_t>(b)];
  const bool nan_a = std::isnan(la), nan_b = std::isnan(lb);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && la != lb) return la > lb;
  return a < b;
}

}  // namespace

Status prepare_indexer_query_f32(const IndexerQueryArgs& args, const IndexerQueryShape& shape) {
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(kDim)) / std::sqrt(static_cast<float>(shape.heads));
  float row[kDim];
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const float* cos_sin = args.rope->row(read_index(args.positions, t));
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      load_f32(args.q, t * args.q.stride[0] + h * args.q.stride[1], kDim, row);
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
  return Status::Ok();
}

Status indexer_topk_f32(const IndexerTopkArgs& args, const IndexerTopkShape& shape) {
  const std::int64_t page = args.key_cache.page_size();
  std::vector<float> keys;  // decoded keys of `keys_request`, [keys_count, 128]
  std::int64_t keys_request = -1, keys_count = 0;
  std::vector<float> query(static_cast<std::size_t>(shape.heads * kDim));
  std::vector<float> scores, logits;
  std::vector<std::int32_t> order;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    std::int32_t* out = args.topk_indices.ptr<std::int32_t>() + t * args.topk_indices.stride[0];
    const std::int64_t entries = (read_index(args.positions, t) + 1) / kIndexerRatio;
    const std::int64_t req = entries > 0 ? read_index(args.token_to_request, t) : -1;
    if (entries > 0 && (req != keys_request || entries > keys_count)) {
      keys.resize(static_cast<std::size_t>(entries * kDim));
      for (std::int64_t j = (req == keys_request ? keys_count : 0); j < entries; ++j) {
        const std::int64_t slot = read_table(args.block_table, req, j / page) * page + j % page;
        decode_indexer_key(args.key_cache, slot, keys.data() + j * kDim);
      }
      keys_request = req;
      keys_count = entries;
    }
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      const auto* codes = args.q_fp8.ptr<const std::uint8_t>() + t * args.q_fp8.stride[0] + h * args.q_fp8.stride[1];
      for (int i = 0; i < kDim; ++i) query[static_cast<std::size_t>(h * kDim + i)] = e4m3_to_f32(codes[i]);
    }
    scores.resize(static_cast<std::size_t>(shape.heads * entries));
    logits.assign(static_cast<std::size_t>(entries), 0.0f);
    if (entries > 0) {
      // scores[h, j] = q8[h] . k[j]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(shape.heads), static_cast<int>(entries),
                  kDim, 1.0f, query.data(), kDim, keys.data(), kDim, 0.0f, scores.data(), static_cast<int>(entries));
    }
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      const float w = args.head_weights.ptr<const float>()[t * args.head_weights.stride[0] + h * args.head_weights.stride[1]];
      const float* s = scores.data() + h * entries;
      for (std::int64_t j = 0; j < entries; ++j) logits[static_cast<std::size_t>(j)] += w * std::max(s[j], 0.0f);
    }
    order.resize(static_cast<std::size_t>(entries));
    for (std::int64_t j = 0; j < entries; ++j) order[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
    const std::int64_t kept = std::min(entries, shape.top_k);
    std::partial_sort(order.begin(), order.begin() + kept, order.end(),
                      [&](std::int32_t a, std::int32_t b) { return ranks_before(logits, a, b); });
    std::sort(order.begin(), order.begin() + kept);
    for (std::int64_t k = 0; k < shape.top_k; ++k) out[k] = k < kept ? order[static_cast<std::size_t>(k)] : -1;
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
