// The f32 FMA peak of this machine, measured: a register-resident chain of
// independent vector FMAs on every thread at once (best SIMD target).
#pragma once

namespace smla::bench {

struct FmaPeak {
  double gflops = 0.0;  // all threads together
  int threads = 0;
  int lanes = 0;        // f32 lanes per vector of the target that ran
};

FmaPeak measure_fma_peak(int threads);

}  // namespace smla::bench
