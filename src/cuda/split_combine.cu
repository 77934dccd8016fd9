// Split-KV combine: merges the normalised f32 partials of each (token, head)
// by their sums and raw maxima and adds the attention sink to the denominator.
// One warp per head (combine_split_row). Launched as a programmatic dependent of
// the attention grid on sm90+ (attention_plan.h), unless the grid's clusters
// merge their own splits (SparseAttentionParams::fold_splits).
#include <cuda_bf16.h>

#include <cmath>

#include "src/cuda/common/split_combine.cuh"
#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {
namespace {

constexpr int kCombineHeads = 4;  // 4 heads a CTA: small batches spread over more SMs (docs/PERF.md)
// Warps a head, each merging its share of the value columns: more splits in flight
// per lane for the same registers.
constexpr int kCombineColumnParts = 2;
constexpr int kCombineThreads = kCombineHeads * kCombineColumnParts * 32;
// Splits whose partials a lane has in flight at once: 116 registers, 1.6% faster on
// the small-batch set than one warp a head at 4 (144 registers) and 6% at V3.2 b = 2
// (16 splits); one warp a head at 8 (209) measured 4-13% slower (docs/PERF.md, session 38).
constexpr int kCombineSplitsInFlight = 8;

// One CTA an SM at least, so that ptxas keeps a group's loads in flight together:
// left to aim at more CTAs an SM, it issued them one split at a time, each consumed
// by its FMAs before the next (80 registers instead of 144 at one warp a head and 4
// in flight), and the kernel measured 2-3.5 us slower at b = 2 (docs/PERF.md, session 38).
__global__ void __launch_bounds__(kCombineThreads, 1) split_combine_kernel(const __grid_constant__ SparseAttentionParams p) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int token = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y) * kCombineHeads + warp / kCombineColumnParts;
  if (head >= p.num_heads) return;
  const SplitRow splits = split_row(p, token, head);  // before the wait, under the attention grid's tail
  wait_for_prior_grid();
  combine_split_row<kCombineSplitsInFlight, kCombineColumnParts>(p, splits, token, head, static_cast<int>(threadIdx.x) % 32,
                                                                  warp % kCombineColumnParts);
}

}  // namespace

cudaError_t launch_split_combine(const SparseAttentionParams& params, bool programmatic, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(params.num_tokens),
                        static_cast<unsigned>((params.num_heads + kCombineHeads - 1) / kCombineHeads));
  config.blockDim = dim3(kCombineThreads);
  config.stream = stream;
  cudaLaunchAttribute chained{};
  chained.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chained.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic) {
    config.attrs = &chained;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, split_combine_kernel, params);
}

}  // namespace smla::cuda
