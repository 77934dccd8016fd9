// The cuda row of prepare_indexer_query (spec 1.8): per (token, head) warp row of 128,
// RoPE on dims 64..127, bf16 rounding, FP8 with one power-of-two scale that is
// folded into the head weight.
#include <cmath>
#include <cstdint>
#include <string>

#include "src/runtime/layer/layer_ops.h"
#include "src/cuda/layer/layer_device.cuh"

namespace smla {
namespace {

using layer_cuda::IndexVectorRef;
using layer_cuda::kIndexerRopeFirstSlot;
using layer_cuda::kIndexerSlots;
using layer_cuda::kWarpSize;
using layer_cuda::RopeFrequencies;

constexpr int kWarps = 8;  // a block: 8 heads of one token, one warp each

struct IndexerQueryParams {
  const void* q;  // [T, heads, 128] f32 or bf16 (the kernel's template type)
  std::int64_t stride_q_t, stride_q_h;
  const float* weights;  // [T, heads]
  std::int64_t stride_w_t, stride_w_h;
  std::uint8_t* q_fp8;  // [T, heads, 128] e4m3 (written)
  std::int64_t stride_q8_t, stride_q8_h;
  float* head_weights;  // [T, heads] (written)
  std::int64_t stride_hw_t, stride_hw_h;
  std::int64_t heads;
  float weight_scale;  // 128^-0.5 * heads^-0.5, computed on the host like the kCpu path
  IndexVectorRef positions;
  RopeFrequencies rope;
};

template <class In>
__global__ void __launch_bounds__(kWarps * kWarpSize) prepare_indexer_query_kernel(const IndexerQueryParams p) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t h = static_cast<std::int64_t>(blockIdx.y) * kWarps + threadIdx.x / kWarpSize;
  if (h >= p.heads) return;
  const int lane = layer_cuda::lane_id();
  const layer_cuda::WarpRope rope = layer_cuda::warp_rope(p.rope, layer_cuda::load_index(p.positions, t));
  float v[kIndexerSlots];
  layer_cuda::load_warp_row(static_cast<const In*>(p.q) + t * p.stride_q_t + h * p.stride_q_h, v);
  layer_cuda::rotate_warp_row<kIndexerSlots, kIndexerRopeFirstSlot>(v, rope);
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kIndexerSlots; ++k) {
    v[k] = round_to_bf16(v[k]);
    amax = fmaxf(amax, layer_cuda::finite_abs(v[k]));
  }
  const int e = layer_cuda::warp_tile_exponent(amax);
  std::uint8_t* codes = p.q_fp8 + t * p.stride_q8_t + h * p.stride_q8_h;
#pragma unroll
  for (int k = 0; k < kIndexerSlots; ++k) codes[k * kWarpSize + lane] = f32_to_e4m3(ldexpf(v[k], -e));
  if (lane == 0) {
    const float w = p.weights[t * p.stride_w_t + h * p.stride_w_h];
    p.head_weights[t * p.stride_hw_t + h * p.stride_hw_h] = __fmul_rn(__fmul_rn(w, ldexpf(1.0f, e)), p.weight_scale);
  }
}

// The device-only limits (the front end checked the rest).
Status check_launch(const Context& context, const IndexerQueryArgs& args, const layer_cuda::IndexerQueryShape& shape) {
  if (shape.tokens > layer_cuda::kMaxGridX) {
    return invalid_argument("q", "at most 2^31-1 tokens", std::to_string(shape.tokens));
  }
  if (shape.heads > layer_cuda::kMaxGridY * kWarps) {
    return invalid_argument("q", "at most " + std::to_string(layer_cuda::kMaxGridY * kWarps) + " heads",
                            args.q.shape_string());
  }
  return layer_cuda::check_on_context_device(context, {{&args.q, "q"},
                                                       {&args.weights, "weights"},
                                                       {&args.positions, "positions"},
                                                       {&args.q_fp8, "q_fp8"},
                                                       {&args.head_weights, "head_weights"}});
}

}  // namespace

Status layer_cuda::prepare_indexer_query(const Context& context, const IndexerQueryArgs& args,
                                         const IndexerQueryShape& shape, void*) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  IndexerQueryParams p{};
  p.q = args.q.data;
  p.stride_q_t = args.q.stride[0];
  p.stride_q_h = args.q.stride[1];
  p.weights = args.weights.ptr<const float>();
  p.stride_w_t = args.weights.stride[0];
  p.stride_w_h = args.weights.stride[1];
  p.q_fp8 = args.q_fp8.ptr<std::uint8_t>();
  p.stride_q8_t = args.q_fp8.stride[0];
  p.stride_q8_h = args.q_fp8.stride[1];
  p.head_weights = args.head_weights.ptr<float>();
  p.stride_hw_t = args.head_weights.stride[0];
  p.stride_hw_h = args.head_weights.stride[1];
  p.heads = args.q.shape[1];
  p.weight_scale = 1.0f / std::sqrt(static_cast<float>(kIndexerHeadDim)) / std::sqrt(static_cast<float>(p.heads));
  p.positions = layer_cuda::index_vector(args.positions);
  p.rope = layer_cuda::rope_frequencies(*args.rope, RopeDirection::kForward);
  const std::int64_t tokens = args.q.shape[0];
  if (tokens == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(context.stream());
  const dim3 blocks(static_cast<unsigned>(tokens), static_cast<unsigned>((p.heads + kWarps - 1) / kWarps));
  if (args.q.dtype == DType::kF32) {
    prepare_indexer_query_kernel<float><<<blocks, kWarps * kWarpSize, 0, s>>>(p);
  } else {
    prepare_indexer_query_kernel<std::uint16_t><<<blocks, kWarps * kWarpSize, 0, s>>>(p);
  }
  return layer_cuda::launch_status();
}

}  // namespace smla
