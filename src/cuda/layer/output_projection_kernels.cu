// Device half of cuda_project_output: inverse RoPE copy into the GEMM scratch
// (output_projection_kernels.h). The GEMMs themselves run in cuBLASLt.
#include <algorithm>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/cuda/layer/output_projection_kernels.h"

namespace smla::layer_cuda {
namespace {

constexpr int kHeadDim = V4Fp8Format::kHeadDim;  // 512
constexpr int kNopeDim = V4Fp8Format::kNopeDim;  // 448: first rotated dim
constexpr int kThreads = 128;
constexpr int kValuesPerThread = kHeadDim / kThreads;  // 4 = two GPT-J pairs
static_assert(kValuesPerThread % 2 == 0 && kNopeDim % kValuesPerThread == 0);

__device__ float load_value(const InverseRopeParams& p, std::int64_t offset) {
  if (p.o_bf16) return bf16_to_f32(static_cast<const std::uint16_t*>(p.o)[offset]);
  return static_cast<const float*>(p.o)[offset];
}

__device__ void store_value(const InverseRopeParams& p, std::int64_t offset, float value) {
  if (p.out_bf16) {
    static_cast<std::uint16_t*>(p.out)[offset] = f32_to_bf16(value);
  } else {
    static_cast<float*>(p.out)[offset] = value;
  }
}

__global__ void __launch_bounds__(kThreads) inverse_rope_copy_kernel(const InverseRopeParams p) {
  const std::int64_t rows = p.tokens * p.heads;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t t = row / p.heads;
    const std::int64_t h = row % p.heads;
    const int first = static_cast<int>(threadIdx.x) * kValuesPerThread;
    float v[kValuesPerThread];
    const std::int64_t src = t * p.stride_o_t + h * p.stride_o_h + first;
    for (int i = 0; i < kValuesPerThread; ++i) v[i] = load_value(p, src + i);
    if (first >= kNopeDim) {
      const std::int64_t position = p.positions_i64
                                        ? static_cast<const std::int64_t*>(p.positions)[t * p.stride_positions]
                                        : static_cast<const std::int32_t*>(p.positions)[t * p.stride_positions];
      if (position >= 0 && position < p.max_positions) {
        for (int i = 0; i < kValuesPerThread; i += 2) {
          const int pair = (first - kNopeDim + i) / 2;
          const double angle = static_cast<double>(position) * p.inv_freq[pair];
          const float c = static_cast<float>(cos(angle));
          const float s = static_cast<float>(sin(angle));
          const float even = v[i], odd = v[i + 1];
          // Inverse rotation, no FMA contraction (the same roundings as the host f32 op).
          v[i] = __fadd_rn(__fmul_rn(even, c), __fmul_rn(odd, s));
          v[i + 1] = __fsub_rn(__fmul_rn(odd, c), __fmul_rn(even, s));
        }
      }
    }
    const std::int64_t dst = row * kHeadDim + first;
    for (int i = 0; i < kValuesPerThread; ++i) store_value(p, dst + i, v[i]);
  }
}

}  // namespace

cudaError_t launch_inverse_rope_copy(const InverseRopeParams& params, cudaStream_t stream) {
  const std::int64_t rows = params.tokens * params.heads;
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(rows, std::int64_t{1} << 20));
  inverse_rope_copy_kernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace smla::layer_cuda
