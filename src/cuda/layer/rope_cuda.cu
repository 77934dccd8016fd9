// The cuda row of apply_rope: in-place GPT-J rotation of 64 dims at any offset (spec 1.6).
//
// Blocks of (token, group of heads); lane p of each warp computes the angle of
// pair p once and rotates that pair in kHeadsPerWarp heads.
#include <algorithm>
#include <string>

#include "src/runtime/layer/layer_ops.h"
#include "src/cuda/layer/layer_device.cuh"

namespace smla {
namespace {

using layer_cuda::IndexVectorRef;
using layer_cuda::RopeFrequencies;

constexpr int kWarps = 4;
constexpr int kHeadsPerWarp = 4;

struct RopeParams {
  float* x;                                 // [T, heads, d] (rank 2: heads = 1), rotated in place
  std::int64_t stride_token, stride_head;  // elements; stride_head 0 for rank 2
  std::int64_t heads;
  int rope_offset;           // first rotated dim, any value in [0, d - 64]
  IndexVectorRef positions;  // [T]
  RopeFrequencies rope;
};

__global__ void apply_rope_kernel(const RopeParams p) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t warps = blockDim.x / layer_cuda::kWarpSize;
  const std::int64_t first_head = static_cast<std::int64_t>(blockIdx.y) * warps * kHeadsPerWarp;
  const layer_cuda::WarpRope rope = layer_cuda::warp_rope(p.rope, layer_cuda::load_index(p.positions, t));
  if (!rope.active) return;
  const int pair = layer_cuda::lane_id();
  const float c = rope.cos_lane;
  const float s = rope.sin_lane;
  const std::int64_t last_head = min(first_head + warps * kHeadsPerWarp, p.heads);
  for (std::int64_t h = first_head + threadIdx.x / layer_cuda::kWarpSize; h < last_head; h += warps) {
    float* x = p.x + t * p.stride_token + h * p.stride_head + p.rope_offset + 2 * pair;
    const float even = x[0];
    const float odd = x[1];
    x[0] = __fsub_rn(__fmul_rn(even, c), __fmul_rn(odd, s));
    x[1] = __fadd_rn(__fmul_rn(even, s), __fmul_rn(odd, c));
  }
}

// The device-only limits (the front end checked the rest).
Status check_launch(const Context& context, const RopeArgs& args, const layer_cuda::RopeShape& shape) {
  if (shape.tokens > layer_cuda::kMaxGridX) {
    return invalid_argument("x", "at most 2^31-1 tokens", std::to_string(shape.tokens));
  }
  constexpr std::int64_t kMaxHeads = layer_cuda::kMaxGridY * kWarps * kHeadsPerWarp;
  if (shape.heads > kMaxHeads) {
    return invalid_argument("x", "at most " + std::to_string(kMaxHeads) + " heads", args.x.shape_string());
  }
  return layer_cuda::check_on_context_device(context, {{&args.x, "x"}, {&args.positions, "positions"}});
}

}  // namespace

Status layer_cuda::apply_rope(const Context& context, const RopeArgs& args, const RopeShape& shape, void*) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  const bool rank2 = args.x.rank == 2;
  RopeParams p{};
  p.x = args.x.ptr<float>();
  p.stride_token = args.x.stride[0];
  p.heads = rank2 ? 1 : args.x.shape[1];
  p.stride_head = rank2 ? 0 : args.x.stride[1];
  p.rope_offset = args.rope_offset;
  p.positions = layer_cuda::index_vector(args.positions);
  p.rope = layer_cuda::rope_frequencies(*args.table, args.direction);
  const std::int64_t tokens = args.x.shape[0];
  if (tokens == 0 || p.heads == 0) return Status::Ok();
  const int warps = static_cast<int>(std::min<std::int64_t>(p.heads, kWarps));
  const std::int64_t heads_per_block = static_cast<std::int64_t>(warps) * kHeadsPerWarp;
  const dim3 blocks(static_cast<unsigned>(tokens),
                    static_cast<unsigned>((p.heads + heads_per_block - 1) / heads_per_block));
  apply_rope_kernel<<<blocks, warps * layer_cuda::kWarpSize, 0, static_cast<cudaStream_t>(context.stream())>>>(p);
  return layer_cuda::launch_status();
}

}  // namespace smla
