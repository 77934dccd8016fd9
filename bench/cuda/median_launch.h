// The ceilings' timing: median of `runs` launches after `warmup` more, CUDA events
// around each (no L2 flush: a ceiling is measured on warm caches).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "testkit/cuda/device_copy.h"

namespace smla::bench {

template <class Launch>
double median_launch_us(int warmup, int runs, Launch&& launch) {
  using cudatest::check_cuda;
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int run = 0; run < warmup + runs; ++run) {
    check_cuda(cudaEventRecord(start), "record");
    launch();
    check_cuda(cudaEventRecord(stop), "record");
    check_cuda(cudaEventSynchronize(stop), "sync");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (run >= warmup) times.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace smla::bench
