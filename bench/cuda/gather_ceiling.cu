#include "bench/cuda/gather_ceiling.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/cuda/median_launch.h"
#include "src/cuda/common/ptx.cuh"
#include "testkit/cuda/device_copy.h"

namespace smla::bench {
namespace {

using cudatest::check_cuda;

constexpr int kThreads = 256;
constexpr int kRowBytes = 1024;                       // a bf16 row of 512 values (the flat prefill workspace)
constexpr int kRowsPerStage = 32;                      // 32 KB: one half-buffer of the copying kernel
constexpr int kUnitsPerRow = kRowBytes / 16;
constexpr int kUnitsPerThread = kRowsPerStage * kUnitsPerRow / kThreads;
constexpr int kStageBytes = kRowsPerStage * kRowBytes;
constexpr int kRowsPerCta = 4096;                      // 4 MB a CTA: long enough to hide the launch
static_assert(kRowsPerStage * kUnitsPerRow % kThreads == 0 && kRowsPerCta % kRowsPerStage == 0);

// Each thread copies the same 16-byte units of every stage, so its own wait for a
// stage's group (at most kStages - 1 newer ones pending) is all the reuse of that
// stage's memory needs; nothing reads the copies. kStages x 32 KB are in flight.
template <int kStages>
__global__ void __launch_bounds__(kThreads, 1) row_gather_kernel(const std::uint8_t* pool, const std::uint32_t* order) {
  extern __shared__ __align__(16) std::uint8_t stages[];
  const std::uint32_t* rows = order + static_cast<std::int64_t>(blockIdx.x) * kRowsPerCta;
  for (int stage = 0; stage < kRowsPerCta / kRowsPerStage; ++stage) {
    if (stage >= kStages) cuda::cp_async_wait_group<kStages - 1>();
    std::uint8_t* to = stages + (stage % kStages) * kStageBytes;
#pragma unroll
    for (int u = 0; u < kUnitsPerThread; ++u) {
      const int unit = static_cast<int>(threadIdx.x) + u * kThreads;
      const int row = unit / kUnitsPerRow;
      const int column = unit % kUnitsPerRow;
      const std::uint32_t source = __ldg(rows + stage * kRowsPerStage + row);
      cuda::cp_async_16(to + row * kRowBytes + 16 * column,
                        pool + static_cast<std::int64_t>(source) * kRowBytes + 16 * column);
    }
    cuda::cp_async_commit();
  }
  cuda::cp_async_wait_all();
}

// One launch shape's inputs: the pool, each CTA's row order, the grid and the timing.
struct GatherRun {
  const std::uint8_t* pool;
  const std::uint32_t* order;
  int ctas;
  int warmup;
  int runs;
};

template <int kStages>
GatherCeiling measure_depth(const GatherRun& run) {
  constexpr int kSharedBytes = kStages * kStageBytes;
  check_cuda(cudaFuncSetAttribute(row_gather_kernel<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
             "shared memory");
  GatherCeiling ceiling;
  ceiling.ctas = run.ctas;
  ceiling.in_flight_kb = kSharedBytes / 1024;
  ceiling.median_us = median_launch_us(run.warmup, run.runs, [&] {
    row_gather_kernel<kStages><<<run.ctas, kThreads, kSharedBytes>>>(run.pool, run.order);
    check_cuda(cudaGetLastError(), "row gather launch");
  });
  const double bytes = static_cast<double>(run.ctas) * kRowsPerCta * kRowBytes;
  ceiling.tbps = bytes / (ceiling.median_us * 1e-6) / 1e12;
  ceiling.gbps_per_sm = ceiling.tbps * 1e3 / run.ctas;  // one CTA an SM (128 KB and more: no room for a second)
  return ceiling;
}

}  // namespace

std::vector<GatherCeiling> measure_row_gather_ceiling(std::int64_t pool_rows, int warmup, int runs) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "sm count");
  const std::int64_t total_rows = static_cast<std::int64_t>(sms) * kRowsPerCta;
  std::vector<std::uint32_t> order(static_cast<std::size_t>(total_rows));
  std::mt19937_64 rng(20261129);
  std::uniform_int_distribution<std::int64_t> pick(0, pool_rows - 1);
  for (auto& row : order) row = static_cast<std::uint32_t>(pick(rng));
  const std::size_t pool_bytes = static_cast<std::size_t>(pool_rows) * kRowBytes;
  cudatest::DeviceBuffer pool(pool_bytes);
  cudatest::DeviceBuffer device_order(order.size() * sizeof(std::uint32_t));
  check_cuda(cudaMemset(pool.data(), 0x3C, pool_bytes), "memset");
  check_cuda(cudaMemcpy(device_order.data(), order.data(), order.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice),
             "copy");
  const GatherRun run{static_cast<const std::uint8_t*>(pool.data()), static_cast<const std::uint32_t*>(device_order.data()),
                      sms, warmup, runs};
  std::vector<GatherCeiling> curve = {measure_depth<1>(run), measure_depth<2>(run), measure_depth<4>(run),
                                      measure_depth<6>(run)};
  // Fewer SMs pulling, each with 128 KB in flight (more than half an SM's shared memory: one CTA an SM).
  for (const int share : {2, 4}) {
    GatherRun fewer = run;
    fewer.ctas = std::max(sms / share, 1);
    curve.push_back(measure_depth<4>(fewer));
  }
  return curve;
}

}  // namespace smla::bench
