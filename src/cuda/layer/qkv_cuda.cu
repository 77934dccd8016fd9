// The cuda rows of prepare_query and prepare_kv (spec 1.4, 1.5): one warp per
// 512-dim row (a warp row, layer_device.cuh), f32 math, one bf16 rounding.
#include <cmath>
#include <cstdint>
#include <string>

#include "src/runtime/layer/layer_ops.h"
#include "src/cuda/layer/layer_device.cuh"

namespace smla {
namespace {

using layer_cuda::IndexVectorRef;
using layer_cuda::kRow512Slots;
using layer_cuda::kRope512FirstSlot;
using layer_cuda::kWarpSize;
using layer_cuda::PagedCacheRef;
using layer_cuda::RopeFrequencies;

constexpr std::int64_t kHeadDim = V4Fp8Format::kHeadDim;
constexpr int kQueryWarps = 8;  // warps of a query block: 8 heads of one token, one each
constexpr int kKvWarps = 4;     // warps of a KV block: one token each

struct QueryParams {
  const void* q;  // [T, heads, 512] f32 or bf16 (the kernel's template type)
  std::int64_t stride_q_t, stride_q_h;
  std::uint16_t* out;  // [T, padded_heads, 512] bf16; heads >= `heads` zero-filled
  std::int64_t stride_out_t, stride_out_h;
  std::int64_t heads, padded_heads;
  IndexVectorRef positions;  // [T]
  RopeFrequencies rope;
  float eps;
};

template <class In>
__global__ void __launch_bounds__(kQueryWarps * kWarpSize) prepare_query_kernel(const QueryParams p) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t h = static_cast<std::int64_t>(blockIdx.y) * kQueryWarps + threadIdx.x / kWarpSize;
  if (h >= p.padded_heads) return;
  const int lane = layer_cuda::lane_id();
  std::uint16_t* out = p.out + t * p.stride_out_t + h * p.stride_out_h;
  if (h >= p.heads) {
#pragma unroll
    for (int k = 0; k < kRow512Slots; ++k) out[k * kWarpSize + lane] = 0;
    return;
  }
  const layer_cuda::WarpRope rope = layer_cuda::warp_rope(p.rope, layer_cuda::load_index(p.positions, t));
  float v[kRow512Slots];
  layer_cuda::load_warp_row(static_cast<const In*>(p.q) + t * p.stride_q_t + h * p.stride_q_h, v);
  float lane_squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kRow512Slots; ++k) lane_squares = __fadd_rn(lane_squares, __fmul_rn(v[k], v[k]));
  const float mean_square = __fdiv_rn(layer_cuda::warp_sum(lane_squares), static_cast<float>(kHeadDim));
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_square, p.eps)));
#pragma unroll
  for (int k = 0; k < kRow512Slots; ++k) v[k] = __fmul_rn(v[k], inv_rms);
  layer_cuda::rotate_warp_row<kRow512Slots, kRope512FirstSlot>(v, rope);
#pragma unroll
  for (int k = 0; k < kRow512Slots; ++k) out[k * kWarpSize + lane] = f32_to_bf16(v[k]);
}

struct KvParams {
  const void* kv;  // [T, 512] f32 or bf16 (the kernel's template type)
  std::int64_t stride_kv_t;
  std::int64_t tokens, inserted;  // inserted = slot_mapping length (<= tokens)
  IndexVectorRef positions;       // [T]
  IndexVectorRef slot_mapping;    // [inserted], -1 = skip
  RopeFrequencies rope;
  PagedCacheRef cache;            // a 512-dim format (the kernel's template type)
  std::uint16_t* rotated;         // [T, 512] bf16, nullptr when absent
  std::int64_t stride_rotated_t;
};

// Padding (-1), an out-of-range slot and a negative position insert nothing.
template <class In, class Format>
__global__ void __launch_bounds__(kKvWarps * kWarpSize) prepare_kv_kernel(const KvParams p) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kKvWarps + threadIdx.x / kWarpSize;
  if (t >= p.tokens) return;
  const int lane = layer_cuda::lane_id();
  const std::int64_t position = layer_cuda::load_index(p.positions, t);
  std::int64_t slot = t < p.inserted ? layer_cuda::load_index(p.slot_mapping, t) : -1;
  if (slot >= p.cache.num_slots || position < 0) slot = -1;
  if (slot >= 0 && !layer_cuda::warp_is_last_store(p.slot_mapping, p.inserted, t, slot)) slot = -1;
  if (slot < 0 && p.rotated == nullptr) return;
  float v[kRow512Slots];
  layer_cuda::load_warp_row(static_cast<const In*>(p.kv) + t * p.stride_kv_t, v);
  layer_cuda::rotate_warp_row<kRow512Slots, kRope512FirstSlot>(v, layer_cuda::warp_rope(p.rope, position));
#pragma unroll
  for (int k = 0; k < kRow512Slots; ++k) v[k] = round_to_bf16(v[k]);
  if (p.rotated != nullptr) {
    std::uint16_t* out = p.rotated + t * p.stride_rotated_t;
#pragma unroll
    for (int k = 0; k < kRow512Slots; ++k) out[k * kWarpSize + lane] = f32_to_bf16(v[k]);
  }
  if (slot >= 0) layer_cuda::warp_store_row_512<Format>(v, p.cache, slot);
}

// The device-only limits (the front end checked the rest).
Status check_launch(const Context& context, const QueryPrepArgs& args, const layer_cuda::QueryShape& shape) {
  if (shape.tokens > layer_cuda::kMaxGridX) {
    return invalid_argument("q", "at most 2^31-1 tokens", std::to_string(shape.tokens));
  }
  if (shape.padded_heads > layer_cuda::kMaxGridY * kQueryWarps) {
    return invalid_argument("out", "at most " + std::to_string(layer_cuda::kMaxGridY * kQueryWarps) + " heads",
                            args.out.shape_string());
  }
  return layer_cuda::check_on_context_device(context,
                                             {{&args.q, "q"}, {&args.out, "out"}, {&args.positions, "positions"}});
}

Status check_launch(const Context& context, const KvPrepArgs& args, const layer_cuda::KvShape& shape) {
  if (shape.tokens > layer_cuda::kMaxGridX) {
    return invalid_argument("kv", "at most 2^31-1 tokens", std::to_string(shape.tokens));
  }
  return layer_cuda::check_on_context_device(context, {{&args.kv, "kv"},
                                                       {&args.positions, "positions"},
                                                       {&args.slot_mapping, "slot_mapping"},
                                                       {&args.cache.pages, "cache"},
                                                       {&args.rotated, "rotated"}});
}

}  // namespace

Status layer_cuda::prepare_query(const Context& context, const QueryPrepArgs& args, const QueryShape& shape, void*) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  QueryParams p{};
  p.q = args.q.data;
  p.stride_q_t = args.q.stride[0];
  p.stride_q_h = args.q.stride[1];
  p.out = args.out.ptr<std::uint16_t>();
  p.stride_out_t = args.out.stride[0];
  p.stride_out_h = args.out.stride[1];
  p.heads = args.q.shape[1];
  p.padded_heads = args.out.shape[1];
  p.positions = layer_cuda::index_vector(args.positions);
  p.rope = layer_cuda::rope_frequencies(*args.rope, RopeDirection::kForward);
  p.eps = args.eps;
  const std::int64_t tokens = args.q.shape[0];
  if (tokens == 0 || p.padded_heads == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(context.stream());
  const dim3 blocks(static_cast<unsigned>(tokens),
                    static_cast<unsigned>((p.padded_heads + kQueryWarps - 1) / kQueryWarps));
  if (args.q.dtype == DType::kF32) {
    prepare_query_kernel<float><<<blocks, kQueryWarps * kWarpSize, 0, s>>>(p);
  } else {
    prepare_query_kernel<std::uint16_t><<<blocks, kQueryWarps * kWarpSize, 0, s>>>(p);
  }
  return layer_cuda::launch_status();
}

Status layer_cuda::prepare_kv(const Context& context, const KvPrepArgs& args, const KvShape& shape, void*) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  KvParams p{};
  p.kv = args.kv.data;
  p.stride_kv_t = args.kv.stride[0];
  p.tokens = args.kv.shape[0];
  p.inserted = args.slot_mapping.shape[0];
  p.positions = layer_cuda::index_vector(args.positions);
  p.slot_mapping = layer_cuda::index_vector(args.slot_mapping);
  p.rope = layer_cuda::rope_frequencies(*args.rope, RopeDirection::kForward);
  p.cache = layer_cuda::paged_cache(args.cache);
  if (args.rotated.present()) {
    p.rotated = args.rotated.ptr<std::uint16_t>();
    p.stride_rotated_t = args.rotated.stride[0];
  }
  if (p.tokens == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(context.stream());
  const auto blocks = static_cast<unsigned>((p.tokens + kKvWarps - 1) / kKvWarps);
  const bool f32_input = args.kv.dtype == DType::kF32;
  layer_cuda::visit_row_512_format(args.cache.format, [&](auto format) {
    using Format = decltype(format);
    if (f32_input) {
      prepare_kv_kernel<float, Format><<<blocks, kKvWarps * kWarpSize, 0, s>>>(p);
    } else {
      prepare_kv_kernel<std::uint16_t, Format><<<blocks, kKvWarps * kWarpSize, 0, s>>>(p);
    }
  });
  return layer_cuda::launch_status();
}

}  // namespace smla
