// kReference: query and KV preparation in float64 plain loops.
#include <cmath>

#include "smla/numeric.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/layer_ops.h"
#include "src/reference/layer/rope_f64.h"

namespace smla::layer_detail {

namespace {
constexpr int kHeadDim = V4Fp8Format::kHeadDim;
constexpr int kRopeOffset = V4Fp8Format::kNopeDim;
}  // namespace

Status prepare_query_f64(const QueryPrepArgs& args, const QueryShape& shape) {
  double row[kHeadDim];
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t position = read_index(args.positions, t);
    for (std::int64_t h = 0; h < shape.padded_heads; ++h) {
      auto* out = args.out.ptr<std::uint16_t>() + t * args.out.stride[0] + h * args.out.stride[1];
      if (h >= shape.heads) {
        for (int i = 0; i < kHeadDim; ++i) out[i] = 0;
        continue;
      }
      load_floats(args.q, t * args.q.stride[0] + h * args.q.stride[1], kHeadDim, row);
      double mean_square = 0.0;
      for (int i = 0; i < kHeadDim; ++i) mean_square += row[i] * row[i];
      mean_square /= kHeadDim;
      const double scale = 1.0 / std::sqrt(mean_square + static_cast<double>(args.eps));
      for (int i = 0; i < kHeadDim; ++i) row[i] *= scale;
      rotate_f64(row + kRopeOffset, *args.rope, position, RopeDirection::kForward);
      for (int i = 0; i < kHeadDim; ++i) out[i] = f32_to_bf16(static_cast<float>(row[i]));
    }
  }
  return Status::Ok();
}

Status prepare_kv_f64(const KvPrepArgs& args, const KvShape& shape) {
  double row[kHeadDim];
  float rounded[kHeadDim];
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t slot = t < shape.inserted ? read_index(args.slot_mapping, t) : -1;
    if (slot < 0 && !args.rotated.present()) continue;
    load_floats(args.kv, t * args.kv.stride[0], kHeadDim, row);
    rotate_f64(row + kRopeOffset, *args.rope, read_index(args.positions, t), RopeDirection::kForward);
    for (int i = 0; i < kHeadDim; ++i) rounded[i] = round_to_bf16(static_cast<float>(row[i]));
    if (args.rotated.present()) {
      auto* out = args.rotated.ptr<std::uint16_t>() + t * args.rotated.stride[0];
      for (int i = 0; i < kHeadDim; ++i) out[i] = f32_to_bf16(rounded[i]);
    }
    if (slot >= 0) store_row_512(args.cache, slot, rounded);
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
