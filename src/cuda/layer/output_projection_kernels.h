// Internal: the device half of cuda_project_output (output_projection_kernels.cu):
// the inverse GPT-J RoPE that copies the attention output into the GEMM scratch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smla/rope.h"

namespace smla::layer_cuda {

// One launch: for every token t and head h < heads, row (t, h) of `o` (512
// values) is copied to out + (t * heads + h) * 512 with dims 448..511 rotated
// back (inverse GPT-J) at positions[t]; a position outside [0, max_positions)
// copies the row unrotated. cos/sin come from double angles pos * inv_freq[p],
// rounded once to f32 (as the host table does); the rotation is plain f32.
struct InverseRopeParams {
  const void* o = nullptr;  // f32 or bf16, last dim contiguous
  bool o_bf16 = false;
  std::int64_t stride_o_t = 0, stride_o_h = 0;  // elements
  const void* positions = nullptr;              // i32 or i64
  bool positions_i64 = false;
  std::int64_t stride_positions = 0;
  std::int64_t max_positions = 0;
  double inv_freq[kRopePairs] = {};
  void* out = nullptr;  // [tokens, heads, 512] contiguous, f32 or bf16 (rounded once)
  bool out_bf16 = false;
  std::int64_t tokens = 0, heads = 0;
};

cudaError_t launch_inverse_rope_copy(const InverseRopeParams& params, cudaStream_t stream);

}  // namespace smla::layer_cuda
