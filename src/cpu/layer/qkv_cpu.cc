// kCpu: query and KV preparation in f32 with one final bf16 rounding.
//
// Tokens (query: token x head rows) run in parallel on the CPU backend's
// thread pool; each row's arithmetic is the same serial chain whatever the
// thread count or the way a prefill is chunked.
#include <cmath>
#include <cstring>
#include <vector>

#include "smla/numeric.h"
#include "src/cpu/thread_pool.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/core/strided_access.h"
#include "src/cpu/layer/parallel_rows.h"
#include "src/cpu/layer/rope_f32.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {

namespace {
constexpr int kHeadDim = V4Fp8Format::kHeadDim;
constexpr int kRopeOffset = V4Fp8Format::kNopeDim;

void prepare_query_row(const QueryPrepArgs& args, const QueryShape& shape, std::int64_t t, std::int64_t h) {
  auto* out = args.out.ptr<std::uint16_t>() + t * args.out.stride[0] + h * args.out.stride[1];
  if (h >= shape.heads) {
    std::memset(out, 0, sizeof(std::uint16_t) * kHeadDim);
    return;
  }
  float row[kHeadDim];
  load_floats(args.q, t * args.q.stride[0] + h * args.q.stride[1], kHeadDim, row);
  float sum_squares = 0.0f;
  for (int i = 0; i < kHeadDim; ++i) sum_squares += row[i] * row[i];
  const float inv_rms = 1.0f / std::sqrt(sum_squares / kHeadDim + args.eps);
  for (int i = 0; i < kHeadDim; ++i) row[i] *= inv_rms;
  rotate_f32(row + kRopeOffset, args.rope->row(read_index(args.positions, t)), RopeDirection::kForward);
  for (int i = 0; i < kHeadDim; ++i) out[i] = f32_to_bf16(row[i]);
}

}  // namespace

Status prepare_query_f32(const QueryPrepArgs& args, const QueryShape& shape) {
  cpu::parallel_for(shape.tokens * shape.padded_heads, [&](std::int64_t item, int) {
    prepare_query_row(args, shape, item / shape.padded_heads, item % shape.padded_heads);
  });
  return Status::Ok();
}

Status prepare_kv_f32(const KvPrepArgs& args, const KvShape& shape) {
  const auto slot_of = [&](std::int64_t t) { return t < shape.inserted ? read_index(args.slot_mapping, t) : -1; };
  const std::vector<bool> store = last_store_per_slot(shape.tokens, slot_of);
  cpu::parallel_for(shape.tokens, [&](std::int64_t t, int) {
    const std::int64_t slot = slot_of(t);
    if (slot < 0 && !args.rotated.present()) return;
    float row[kHeadDim];
    load_floats(args.kv, t * args.kv.stride[0], kHeadDim, row);
    rotate_f32(row + kRopeOffset, args.rope->row(read_index(args.positions, t)), RopeDirection::kForward);
    for (int i = 0; i < kHeadDim; ++i) row[i] = round_to_bf16(row[i]);
    if (args.rotated.present()) {
      auto* out = args.rotated.ptr<std::uint16_t>() + t * args.rotated.stride[0];
      for (int i = 0; i < kHeadDim; ++i) out[i] = f32_to_bf16(row[i]);
    }
    if (store[static_cast<std::size_t>(t)]) store_row_512(args.cache, slot, row);
  });
  return Status::Ok();
}

}  // namespace smla::layer_detail
