#include "bench/cuda/tma_row_probe.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/cuda/median_launch.h"
#include "src/cuda/sm90/sm90_ptx.cuh"
#include "src/cuda/sm90/sm90_tensor_map.h"
#include "testkit/cuda/device_copy.h"

namespace smla::bench {
namespace {

using cudatest::check_cuda;
using cuda::smem_address;
namespace sm90 = cuda::sm90;

constexpr int kRowValues = 512;                         // a bf16 row of the flat prefill workspace (d 512)
constexpr int kRowBytes = kRowValues * 2;
constexpr int kBoxValues = 64;                          // one 128-byte swizzle row
constexpr int kCheckRows = 64;                          // one K tile: 8 regions of 64 rows x 128 bytes
constexpr int kCheckBytes = kCheckRows * kRowBytes;
constexpr int kStageRows = 32;                          // 32 KB a stage, as the copying kernel's halves
constexpr int kStageBytes = kStageRows * kRowBytes;
constexpr int kStages = 4;                              // 128 KB in flight: one CTA an SM
constexpr int kRowsPerCta = 4096;
constexpr int kAlignSlack = sm90::kSwizzleAtomBytes;
static_assert(kRowsPerCta % (kStageRows * kStages) == 0);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the device code exists for sm_90a only; other targets launch nothing
constexpr int kBoxesPerRow = kRowValues / kBoxValues;

__device__ __forceinline__ std::uint8_t* align_to_atom(std::uint8_t* raw) {
  const std::uint32_t address = smem_address(raw);
  return raw + (kAlignSlack - address % kAlignSlack) % kAlignSlack;
}

// One box {64 values, 1 row} of the pool's tensor map at (value x, row y) into shared
// memory, completing its bytes on `barrier`; with kMulticast into both CTAs of the pair.
template <bool kMulticast>
__device__ __forceinline__ void load_row_box(std::uint32_t destination, const CUtensorMap* map, int x, int y,
                                             std::uint32_t barrier) {
  if constexpr (kMulticast) {
    const std::uint16_t both = 0x3;
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(destination),
        "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(barrier), "h"(both)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            destination),
        "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(barrier)
        : "memory");
  }
}

#endif

// 64 rows, a box per 64 values, each box put at row r of its 1024-byte-aligned region
// (region g holds values 64 g .. 64 g + 63 of every row); then every 16-byte unit is
// compared with where the 128-byte swizzle of its address puts it (sm90_ptx.cuh).
__global__ void tma_row_check_kernel(const __grid_constant__ CUtensorMap map, const std::uint8_t* pool,
                                     const std::uint32_t* rows, unsigned long long* misplaced, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  __shared__ __align__(8) std::uint64_t landed;
  std::uint8_t* tile = align_to_atom(smem_raw);
  const std::uint32_t barrier = smem_address(&landed);
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(barrier, 1);
    sm90::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  constexpr int kRegionBytes = kCheckRows * sm90::kSwizzleRowBytes;
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_bytes(barrier, kCheckBytes);
    for (int row = 0; row < kCheckRows; ++row) {
      for (int box = 0; box < kBoxesPerRow; ++box) {
        load_row_box<false>(smem_address(tile + box * kRegionBytes + row * sm90::kSwizzleRowBytes), &map,
                            box * kBoxValues, static_cast<int>(rows[row]), barrier);
      }
    }
  }
  sm90::mbarrier_wait(barrier, 0);
  unsigned long long local = 0;
  constexpr int kUnitsPerRow = kRowBytes / 16;
  for (int unit = static_cast<int>(threadIdx.x); unit < kCheckRows * kUnitsPerRow; unit += static_cast<int>(blockDim.x)) {
    const int row = unit / kUnitsPerRow;
    const int column = unit % kUnitsPerRow;  // 16-byte unit of the row
    const uint4 expected = *reinterpret_cast<const uint4*>(pool + static_cast<std::int64_t>(rows[row]) * kRowBytes + 16 * column);
    const uint4 got = *reinterpret_cast<const uint4*>(tile + (column / 8) * kRegionBytes + sm90::swizzled_offset(row, column % 8));
    local += (expected.x != got.x || expected.y != got.y || expected.z != got.z || expected.w != got.w) ? 1 : 0;
  }
  atomicAdd(misplaced, local);
  if (threadIdx.x == 0) *ran = 1;
#else
  (void)map, (void)pool, (void)rows, (void)misplaced, (void)ran;  // no sm_90a code in this build: *ran stays 0
#endif
}

// One warp a CTA gathers kRowsPerCta random rows through a ring of kStages 32-row
// stages, a lane a row (8 boxes). kMulticast: CTA pairs gather the same rows, each
// issuing its half of every stage to both; before a stage is refilled, each CTA
// tells the other that its previous round there has landed (the refill writes into
// both). Nothing reads the rows.
template <bool kMulticast>
__global__ void __launch_bounds__(32, 1) tma_row_gather_kernel(const __grid_constant__ CUtensorMap map,
                                                               const std::uint32_t* order) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  __shared__ __align__(8) std::uint64_t full[kStages];
  __shared__ __align__(8) std::uint64_t peer_done[kStages];
  std::uint8_t* stages = align_to_atom(smem_raw);
  const int lane = static_cast<int>(threadIdx.x);
  const std::uint32_t rank = kMulticast ? sm90::cluster_rank() : 0u;
  const int group = kMulticast ? static_cast<int>(blockIdx.x) / 2 : static_cast<int>(blockIdx.x);
  const std::uint32_t* rows = order + static_cast<std::int64_t>(group) * kRowsPerCta;
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(smem_address(&full[s]), 1);
      sm90::mbarrier_init(smem_address(&peer_done[s]), 1);
    }
    sm90::fence_mbarrier_init_cluster();
  }
  if constexpr (kMulticast) {
    sm90::cluster_sync();
  } else {
    __syncwarp();
  }
  constexpr int kIssuers = kMulticast ? kStageRows / 2 : kStageRows;
  constexpr int kRegionBytes = kStageRows * sm90::kSwizzleRowBytes;
  constexpr int kTotalStages = kRowsPerCta / kStageRows;
  for (int stage = 0; stage < kTotalStages; ++stage) {
    const int s = stage % kStages;
    const std::uint32_t parity = (stage / kStages) & 1;
    const std::uint32_t full_s = smem_address(&full[s]);
    if (stage >= kStages) {
      sm90::mbarrier_wait(full_s, parity ^ 1);  // this stage's previous round has landed here
      if constexpr (kMulticast) {
        if (lane == 0) sm90::mbarrier_arrive_peer(sm90::peer_address(smem_address(&peer_done[s]), rank ^ 1u));
        sm90::mbarrier_wait(smem_address(&peer_done[s]), parity ^ 1);  // ... and in the peer
      }
    }
    if (lane == 0) sm90::mbarrier_arrive_expect_bytes(full_s, kStageBytes);
    __syncwarp();
    if (lane < kIssuers) {
      const int row = static_cast<int>(rank) * (kStageRows - kIssuers) + lane;
      const int source = static_cast<int>(rows[stage * kStageRows + row]);
      const std::uint32_t at = smem_address(stages + s * kStageBytes) + row * sm90::kSwizzleRowBytes;
      for (int box = 0; box < kBoxesPerRow; ++box) {
        load_row_box<kMulticast>(at + box * kRegionBytes, &map, box * kBoxValues, source, full_s);
      }
    }
  }
  for (int stage = kTotalStages - kStages; stage < kTotalStages; ++stage) {
    sm90::mbarrier_wait(smem_address(&full[stage % kStages]), (stage / kStages) & 1);
  }
  if constexpr (kMulticast) sm90::cluster_sync();  // no CTA leaves while the other may still write into it
#else
  (void)map, (void)order;
#endif
}

// The pool as a 2-D tensor map of bf16: rows x 512 values, boxes of 1 row x 64 values, 128-byte swizzle.
bool encode_pool_map(CUtensorMap* map, void* pool, std::int64_t pool_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = sm90::tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kRowValues), static_cast<cuuint64_t>(pool_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kRowBytes)};
  const cuuint32_t box[2] = {kBoxValues, 1};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pool, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int read_flag(const cudatest::DeviceBuffer& flag) {
  int value = 0;
  check_cuda(cudaMemcpy(&value, flag.data(), sizeof(value), cudaMemcpyDeviceToHost), "copy flag");
  return value;
}

}  // namespace

TmaRowProbe probe_tma_row_gathers(std::int64_t pool_rows, int warmup, int runs) {
  TmaRowProbe probe;
  int device = 0, major = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "sm count");
  if (major != 9) {
    probe.skipped = "needs an sm_90 device";
    return probe;
  }
  pool_rows = std::max<std::int64_t>(pool_rows, kCheckRows);
  // Every 4-byte word of the pool tells its row and place, so a misplaced unit cannot match by chance.
  std::vector<std::uint32_t> words(static_cast<std::size_t>(pool_rows) * kRowBytes / 4);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<std::uint32_t>(i) * 2654435761u + 12345u;
  cudatest::DeviceBuffer pool(words.size() * 4);
  check_cuda(cudaMemcpy(pool.data(), words.data(), words.size() * 4, cudaMemcpyHostToDevice), "copy pool");
  alignas(64) CUtensorMap map{};
  if (!encode_pool_map(&map, pool.data(), pool_rows)) {
    probe.skipped = "the driver has no tensor-map encoder, or it refused the pool's map";
    return probe;
  }
  std::mt19937_64 rng(20261202);
  std::uniform_int_distribution<std::int64_t> pick(0, pool_rows - 1);

  std::vector<std::uint32_t> check_rows(kCheckRows);
  for (auto& row : check_rows) row = static_cast<std::uint32_t>(pick(rng));
  cudatest::DeviceBuffer device_rows(check_rows.size() * 4);
  cudatest::DeviceBuffer misplaced(sizeof(unsigned long long));
  cudatest::DeviceBuffer ran(sizeof(int));
  check_cuda(cudaMemcpy(device_rows.data(), check_rows.data(), check_rows.size() * 4, cudaMemcpyHostToDevice), "copy rows");
  check_cuda(cudaMemset(misplaced.data(), 0, sizeof(unsigned long long)), "memset");
  check_cuda(cudaMemset(ran.data(), 0, sizeof(int)), "memset");
  constexpr int kCheckShared = kCheckBytes + kAlignSlack;
  check_cuda(cudaFuncSetAttribute(tma_row_check_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kCheckShared),
             "shared memory");
  tma_row_check_kernel<<<1, 128, kCheckShared>>>(map, static_cast<const std::uint8_t*>(pool.data()),
                                                 static_cast<const std::uint32_t*>(device_rows.data()),
                                                 static_cast<unsigned long long*>(misplaced.data()),
                                                 static_cast<int*>(ran.data()));
  check_cuda(cudaGetLastError(), "check launch");
  check_cuda(cudaDeviceSynchronize(), "check kernel");
  if (read_flag(ran) == 0) {
    probe.skipped = "this build has no sm_90a code";
    return probe;
  }
  unsigned long long count = 0;
  check_cuda(cudaMemcpy(&count, misplaced.data(), sizeof(count), cudaMemcpyDeviceToHost), "copy count");
  probe.ran = true;
  probe.checked_units = static_cast<std::int64_t>(kCheckRows) * (kRowBytes / 16);
  probe.misplaced_units = static_cast<std::int64_t>(count);

  const int pairs = sms / 2;
  std::vector<std::uint32_t> order(static_cast<std::size_t>(sms) * kRowsPerCta);
  for (auto& row : order) row = static_cast<std::uint32_t>(pick(rng));
  cudatest::DeviceBuffer device_order(order.size() * 4);
  check_cuda(cudaMemcpy(device_order.data(), order.data(), order.size() * 4, cudaMemcpyHostToDevice), "copy order");
  const auto* rows = static_cast<const std::uint32_t*>(device_order.data());
  constexpr int kGatherShared = kStages * kStageBytes + kAlignSlack;
  check_cuda(cudaFuncSetAttribute(tma_row_gather_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGatherShared),
             "shared memory");
  check_cuda(cudaFuncSetAttribute(tma_row_gather_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGatherShared),
             "shared memory");
  const double us = median_launch_us(warmup, runs, [&] {
    tma_row_gather_kernel<false><<<sms, 32, kGatherShared>>>(map, rows);
    check_cuda(cudaGetLastError(), "gather launch");
  });
  probe.gbps_per_sm = static_cast<double>(kRowsPerCta) * kRowBytes / (us * 1e-6) / 1e9;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(2 * pairs));
  config.blockDim = dim3(32);
  config.dynamicSmemBytes = kGatherShared;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  const double multicast_us = median_launch_us(warmup, runs, [&] {
    check_cuda(cudaLaunchKernelEx(&config, tma_row_gather_kernel<true>, map, rows), "multicast launch");
  });
  probe.multicast_gbps_per_sm = static_cast<double>(kRowsPerCta) * kRowBytes / (multicast_us * 1e-6) / 1e9;
  return probe;
}

}  // namespace smla::bench
