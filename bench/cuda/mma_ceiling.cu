#include "bench/cuda/mma_ceiling.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "bench/cuda/median_launch.h"
#include "src/cuda/common/cublaslt_gemm.h"
#include "src/cuda/common/ptx.cuh"
#include "testkit/cuda/device_copy.h"

namespace smla::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;  // 8 warps per scheduler: enough to keep the tensor pipe fed
constexpr int kChains = 8;       // independent accumulators per warp
constexpr int kIterations = 1024;
constexpr double kFlopPerMma = 2.0 * 16 * 8 * 16;

__global__ void __launch_bounds__(kThreads) mma_loop_kernel(float* sink, int iterations) {
  // Finite bf16 operands (1.0 and ~5e-4) derived from the thread id so the
  // compiler cannot fold them; the accumulators stay far from overflow.
  const std::uint32_t a_word = 0x3F803F80u ^ (threadIdx.x & 1u);
  const std::uint32_t a[4] = {a_word, a_word, a_word, a_word};
  const std::uint32_t b0 = 0x3A003A00u ^ (threadIdx.x & 2u), b1 = 0x3A003A00u;
  float acc[kChains][4] = {};
  for (int i = 0; i < iterations; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) cuda::mma_bf16_16816(acc[c], a, b0, b1);
  }
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (total == -1.0f) sink[threadIdx.x] = total;  // never true; keeps the loop observable
}

using cudatest::check_cuda;

// Small nonzero bf16 values (zeros can run faster than real data).
__global__ void fill_bf16_kernel(std::uint16_t* values, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    values[i] = static_cast<std::uint16_t>(0x3C00u + (static_cast<std::uint32_t>(i * 2654435761u) >> 24));
  }
}

}  // namespace

MmaCeiling measure_mma_sync_ceiling(int warmup, int runs) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "sm count");
  float* sink = nullptr;
  check_cuda(cudaMalloc(&sink, kThreads * sizeof(float)), "cudaMalloc");
  const int blocks = sms * kBlocksPerSm;
  MmaCeiling ceiling;
  ceiling.median_us = median_launch_us(warmup, runs, [&] {
    mma_loop_kernel<<<blocks, kThreads>>>(sink, kIterations);
    check_cuda(cudaGetLastError(), "mma loop launch");
  });
  cudaFree(sink);
  const double mmas = static_cast<double>(blocks) * (kThreads / 32) * kIterations * kChains;
  ceiling.tflops = mmas * kFlopPerMma / (ceiling.median_us * 1e-6) / 1e12;
  return ceiling;
}

MmaCeiling measure_bf16_gemm_ceiling(int warmup, int runs) {
  constexpr std::int64_t kSize = 8192;
  constexpr std::int64_t kCount = kSize * kSize;
  std::uint16_t* a = nullptr;
  std::uint16_t* b = nullptr;
  std::uint16_t* out = nullptr;
  void* workspace = nullptr;
  check_cuda(cudaMalloc(&a, kCount * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&b, kCount * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&out, kCount * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&workspace, cuda::kCublasLtWorkspaceBytes), "cudaMalloc");
  fill_bf16_kernel<<<1024, 256>>>(a, kCount);
  fill_bf16_kernel<<<1024, 256>>>(b, kCount);
  check_cuda(cudaGetLastError(), "fill launch");
  cuda::GemmArgs gemm;
  gemm.m = gemm.n = gemm.k = kSize;
  gemm.input_dtype = DType::kBF16;
  gemm.a = a;
  gemm.lda = kSize;
  gemm.b = b;
  gemm.ldb = kSize;
  gemm.out_dtype = DType::kBF16;
  gemm.out = out;
  gemm.ldc = kSize;
  gemm.workspace = workspace;
  gemm.workspace_bytes = cuda::kCublasLtWorkspaceBytes;
  MmaCeiling ceiling;
  ceiling.median_us = median_launch_us(warmup, runs, [&] {
    const Status status = cuda::cublaslt_gemm(gemm);
    if (!status.ok()) throw std::runtime_error("bf16 GEMM ceiling: " + status.to_string());
  });
  cudaFree(a);
  cudaFree(b);
  cudaFree(out);
  cudaFree(workspace);
  ceiling.tflops = 2.0 * kSize * kSize * kSize / (ceiling.median_us * 1e-6) / 1e12;
  return ceiling;
}

}  // namespace smla::bench
