// kCpu: query and KV preparation in f32 with one final bf16 rounding.
#include <cmath>
#include <cstring>

#include "smla/numeric.h"
#include "src/layer/cache_rows.h"
#include "src/layer/checks.h"
#include "src/layer/cpu/rope_f32.h"
#include "src/layer/layer_backend.h"

namespace smla::layer_detail {

namespace {
constexpr int kHeadDim = V4Fp8Format::kHeadDim;
constexpr int kRopeOffset = V4Fp8Format::kNopeDim;
}  // namespace

Status prepare_query_f32(const QueryPrepArgs& args, const QueryShape& shape) {
  float row[kHeadDim];
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const float* cos_sin = args.rope->row(read_index(args.positions, t));
    for (std::int64_t h = 0; h < shape.padded_heads; ++h) {
      auto* out = args.out.ptr<std::uint16_t>() + t * args.out.stride[0] + h * args.out.stride[1];
      if (h >= shape.heads) {
        std::memset(out, 0, sizeof(std::uint16_t) * kHeadDim);
        continue;
      }
      load_f32(args.q, t * args.q.stride[0] + h * args.q.stride[1], kHeadDim, row);
      float sum_squares = 0.0f;
      for (int i = 0; i < kHeadDim; ++i) sum_squares += row[i] * row[i];
      const float inv_rms = 1.0f / std::sqrt(sum_squares / kHeadDim + args.eps);
      for (int i = 0; i < kHeadDim; ++i) row[i] *= inv_rms;
      rotate_f32(row + kRopeOffset, cos_sin, RopeDirection::kForward);
      for (int i = 0; i < kHeadDim; ++i) out[i] = f32_to_bf16(row[i]);
    }
  }
  return Status::Ok();
}

Status prepare_kv_f32(const KvPrepArgs& args, const KvShape& shape) {
  float row[kHeadDim];
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t slot = t < shape.inserted ? read_index(args.slot_mapping, t) : -1;
    if (slot < 0 && !args.rotated.present()) continue;
    load_f32(args.kv, t * args.kv.stride[0], kHeadDim, row);
    rotate_f32(row + kRopeOffset, args.rope->row(read_index(args.positions, t)), RopeDirection::kForward);
    for (int i = 0; i < kHeadDim; ++i) row[i] = round_to_bf16(row[i]);
    if (args.rotated.present()) {
      auto* out = args.rotated.ptr<std::uint16_t>() + t * args.rotated.stride[0];
      for (int i = 0; i < kHeadDim; ++i) out[i] = f32_to_bf16(row[i]);
    }
    if (slot >= 0) store_row_512(args.cache, slot, row);
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
