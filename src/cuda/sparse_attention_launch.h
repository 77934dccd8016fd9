// Internal: the compiled variants of the attention kernel (one per KV row
// loader and head-tile size) and the split-KV combine, as host-callable entries.
#pragma once

#include <cuda_runtime.h>

#include "src/cuda/sparse_attention_params.h"

namespace smla::cuda {

// Which row loader the kernel is built with; each format maps to one.
enum class LoaderKind { kV4Fp8, kV32Fp8, kBf16Rows512, kBf16Rows576, kFp8Rows };

// Launch-time choices of the sm90 kernel (TuningOptions); the portable kernel has none.
struct LaunchFlags {
  bool pair_head_blocks = true;  // h_q 65..128: the two head blocks of a token as a CTA pair
  bool token_major = true;       // a token's head blocks start together
};

struct AttentionVariant {
  int rows = 0;              // query heads per CTA (16, 32 or 64)
  int fixed_smem_bytes = 0;     // dynamic shared memory besides the raw KV ring and a second K tile
  int stage_smem_bytes = 0;     // shared memory of one raw KV stage
  int k_buffer_smem_bytes = 0;  // shared memory of one expanded K tile
  cudaError_t (*launch)(const SparseAttentionParams& params, dim3 grid, int smem_bytes, const LaunchFlags& flags,
                        cudaStream_t stream) = nullptr;
  cudaError_t (*blocks_per_sm)(int smem_bytes, int* blocks) = nullptr;

  int smem_bytes(int stages, int k_buffers) const {
    return fixed_smem_bytes + stages * stage_smem_bytes + (k_buffers - 1) * k_buffer_smem_bytes;
  }
};

// One definition per loader, each in its own translation unit so the variants compile in parallel.
AttentionVariant attention_variant_v4(int rows);
AttentionVariant attention_variant_v32(int rows);
AttentionVariant attention_variant_bf16_512(int rows);
AttentionVariant attention_variant_bf16_576(int rows);
AttentionVariant attention_variant_fp8_rows(int rows);

// The Hopper kernel (src/cuda/sm90): 64-row tiles of one token's heads, wgmma.
// Built only when the build's architectures include sm_90a.
bool sm90_kernels_built();
AttentionVariant sm90_attention_variant(LoaderKind kind);

// The portable kernel's variant with the smallest tile of 16, 32 or 64 rows that holds `rows`.
inline AttentionVariant attention_variant(LoaderKind kind, int rows) {
  switch (kind) {
    case LoaderKind::kV4Fp8: return attention_variant_v4(rows);
    case LoaderKind::kV32Fp8: return attention_variant_v32(rows);
    case LoaderKind::kBf16Rows512: return attention_variant_bf16_512(rows);
    case LoaderKind::kBf16Rows576: return attention_variant_bf16_576(rows);
    case LoaderKind::kFp8Rows: break;
  }
  return attention_variant_fp8_rows(rows);
}

// Merges the num_splits partials of every (token, head) and adds the sink.
// programmatic (sm90+): launched as a programmatic dependent of the grid before
// it on the stream (the attention grid), which it waits for on the device.
cudaError_t launch_split_combine(const SparseAttentionParams& params, bool programmatic, cudaStream_t stream);

}  // namespace smla::cuda
