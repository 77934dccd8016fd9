// The bf16 tensor-core ceiling that mma.sync can reach on this device, the
// instruction every smla attention kernel uses: a register-resident loop of
// independent m16n8k16 MMAs (no memory traffic) timed with CUDA events.
#pragma once

namespace smla::bench {

struct MmaCeiling {
  double tflops = 0.0;  // median over the timed runs
  double median_us = 0.0;
};

// Throws std::runtime_error on a CUDA failure.
MmaCeiling measure_mma_sync_ceiling(int warmup, int runs);

}  // namespace smla::bench
