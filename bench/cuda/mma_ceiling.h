// Tensor-core ceilings measured on the device: what mma.sync can reach (the
// portable kernels' instruction: a register-resident loop of independent
// m16n8k16 MMAs, no memory traffic) and what a cuBLASLt bf16 GEMM reaches.
#pragma once

namespace smla::bench {

struct MmaCeiling {
  double tflops = 0.0;  // median over the timed runs
  double median_us = 0.0;
};

// Throws std::runtime_error on a CUDA failure.
MmaCeiling measure_mma_sync_ceiling(int warmup, int runs);

// The bf16 tensor-core ceiling of the whole chip as cuBLASLt reaches it (wgmma
// on Hopper): an 8192^3 bf16 GEMM with f32 accumulation, median of `runs`.
// This is the ceiling the sm90 attention kernel is measured against.
MmaCeiling measure_bf16_gemm_ceiling(int warmup, int runs);

}  // namespace smla::bench
