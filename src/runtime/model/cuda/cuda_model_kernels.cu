// Element-wise kernels of the CUDA step runner: row norms with bf16 copies and
// the compressor state slots.
#include <cuda_runtime.h>
#include <string>

#include "smla/numeric.h"
#include "src/runtime/model/cuda/cuda_model_kernels.h"

namespace smla::cuda_model {
namespace {

constexpr int kNormThreads = 256;

Status launch_status(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::Ok();
  return internal_error(std::string("Model (cuda): launching ") + kernel + " failed: " + cudaGetErrorString(error));
}

__global__ void row_norm_kernel(RowNormParams p) {
  const std::int64_t row = blockIdx.x;
  const float* in = p.in + row * p.stride_in;
  const float* addend = p.addend != nullptr ? p.addend + row * p.stride_addend : nullptr;
  float scale = 1.0f;
  if (p.normalize) {
    float sum = 0.0f;
    for (std::int64_t i = threadIdx.x; i < p.width; i += blockDim.x) {
      const float v = addend != nullptr ? __fadd_rn(in[i], addend[i]) : in[i];
      sum = fmaf(v, v, sum);
    }
    __shared__ float partial[kNormThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
    scale = static_cast<float>(rsqrt(static_cast<double>(total) / static_cast<double>(p.width) + p.eps));
  }
  for (std::int64_t i = threadIdx.x; i < p.width; i += blockDim.x) {
    float v = addend != nullptr ? __fadd_rn(in[i], addend[i]) : in[i];
    if (p.normalize) v = __fmul_rn(v, p.weight != nullptr ? __fmul_rn(scale, p.weight[i]) : scale);
    if (p.out_f32 != nullptr) p.out_f32[row * p.stride_out_f32 + i] = v;
    if (p.out_bf16 != nullptr) p.out_bf16[row * p.stride_out_bf16 + i] = f32_to_bf16(v);
  }
}

__global__ void state_slots_kernel(StateSlotParams p) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.tokens) return;
  for (const auto& g : p.groups) {
    if (g.slots != nullptr) g.slots[t] = state_slot(p, g, t);
  }
}

}  // namespace

Status launch_row_norm(const RowNormParams& params, void* stream) {
  if (params.rows <= 0 || params.width <= 0) return Status::Ok();
  row_norm_kernel<<<static_cast<unsigned>(params.rows), kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(params);
  return launch_status("row_norm_kernel");
}

Status launch_state_slots(const StateSlotParams& params, void* stream) {
  if (params.tokens <= 0) return Status::Ok();
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>((params.tokens + kThreads - 1) / kThreads);
  state_slots_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(params);
  return launch_status("state_slots_kernel");
}

}  // namespace smla::cuda_model
