// Internal: the compiled variants of the attention kernel (one per kernel row
// source and head-tile size) and the split-KV combine, as host-callable entries.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smla/kv_format.h"
#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

// The prefill workspace's flat rows: kDim bf16 values each (plain rows of d_qk values).
template <int kDim>
struct FlatBf16Rows {
  static constexpr KvRowLayout kLayout = KvRowLayout::kPlainRows;
  static constexpr DType kStorage = DType::kBF16;
  static constexpr int kHeadDim = kDim;
};

// The row sources the kernels are compiled for: every KV format (KvFormats, in
// KvFormat order), then prefill's 576-dim flat rows (its 512-dim ones read as
// bf16-rows). src/cuda/CMakeLists.txt generates one translation unit per entry
// and kernel family, so the variants compile in parallel.
template <class Formats>
struct WithFlatRows;
template <class... Formats>
struct WithFlatRows<KvFormatList<Formats...>> {
  using type = KvFormatList<Formats..., FlatBf16Rows<576>>;
};
using KernelRows = WithFlatRows<KvFormats>::type;
static_assert(Bf16RowsFormat::kLayout == KvRowLayout::kPlainRows && Bf16RowsFormat::kStorage == DType::kBF16 &&
              Bf16RowsFormat::kHeadDim == 512);

// Which entry of KernelRows a kernel reads: a KvFormat's value, or the flat rows after them.
enum class LoaderKind : std::uint8_t {};
constexpr LoaderKind loader_kind(KvFormat format) { return static_cast<LoaderKind>(format); }
constexpr LoaderKind flat_bf16_loader_kind(int d_qk) {
  return d_qk == Bf16RowsFormat::kHeadDim ? loader_kind(KvFormat::kBf16Rows) : static_cast<LoaderKind>(KvFormats::kSize);
}

// Whether a row source stores bf16 values (copied as they are) rather than FP8 codes to expand, from its traits.
template <class... Rows>
constexpr bool stores_bf16(KvFormatList<Rows...>, LoaderKind kind) {
  constexpr bool kBf16[] = {(Rows::kStorage == DType::kBF16)...};
  return kBf16[static_cast<std::size_t>(kind)];
}
constexpr bool rows_stored_as_bf16(LoaderKind kind) { return stores_bf16(KernelRows{}, kind); }
static_assert(rows_stored_as_bf16(loader_kind(KvFormat::kBf16Rows)) && !rows_stored_as_bf16(loader_kind(KvFormat::kV4Fp8)));

// The largest thread-block cluster a launch may fold its splits into: 16 CTAs on
// Hopper (above 8 with the non-portable size attribute).
inline constexpr int kMostFoldedClusterCtas = 16;
// The warps of a folding CTA that merge its rows (the sm90 kernel's two consumer
// warpgroups), kFoldWarpsARow to a row, each merging its share of the columns: so
// kFoldRowsARound rows at a time.
inline constexpr int kFoldMergingWarps = 8;
inline constexpr int kFoldWarpsARow = 2;
inline constexpr int kFoldRowsARound = kFoldMergingWarps / kFoldWarpsARow;
// The heads of each block of a CTA pair: the sm90 kernel's whole 64-row tile.
inline constexpr int kPairedBlockRows = 64;

// Launch-time choices of the sm90 kernel (TuningOptions); the portable kernel has none.
struct LaunchFlags {
  bool pair_head_blocks = true;  // h_q 65..128: the two head blocks of a token as a CTA pair
  bool token_major = true;       // a token's head blocks start together
  // sm90 kernel of copied rows: at most this many CTAs, each running blocks of the
  // grid one after another (0: a CTA per block).
  int persistent_ctas = 0;
  // sm90 kernel of FP8 rows behind the token order prepass: launched with programmatic
  // serialization, so its CTAs are resident while the prepass runs (they wait for
  // its order before they read anything).
  bool after_prepass = false;
  // sm90 kernel of copied rows: outputs by tensor stores where the layout allows (TuningOptions).
  bool tensor_stores = false;
  int output_box_rows = 16;  // ... in boxes of 16 rows (a warp's) or 64 (a warpgroup's)
  // sm90 kernel of FP8 rows, unpaired, grid.z > 1: the splits of a block run as one
  // cluster that merges its partials itself (SparseAttentionParams::fold_splits), so
  // no combine launch follows.
  bool fold_splits = false;
};

// Whether the sm90 FP8 kernel runs a token's head blocks as a CTA pair: asked for,
// two blocks a token, each of kPairedBlockRows heads (the plan and the launch alike).
inline bool runs_as_pairs(const LaunchFlags& flags, int head_blocks, int head_block_rows) {
  return flags.pair_head_blocks && head_blocks == 2 && head_block_rows == kPairedBlockRows;
}

struct AttentionVariant {
  int rows = 0;              // query heads per CTA (16, 32 or 64)
  int fixed_smem_bytes = 0;     // dynamic shared memory besides the raw KV ring and a second K tile
  int stage_smem_bytes = 0;     // shared memory of one raw KV stage
  int k_buffer_smem_bytes = 0;  // shared memory of one expanded K tile
  cudaError_t (*launch)(const SparseAttentionParams& params, dim3 grid, int smem_bytes, const LaunchFlags& flags,
                        cudaStream_t stream) = nullptr;
  cudaError_t (*blocks_per_sm)(int smem_bytes, int* blocks) = nullptr;
  // sm90 kernel of FP8 rows, unpaired: how many clusters of `splits` split CTAs can be
  // resident at once, 0 where none can; null for the other kernels.
  cudaError_t (*folded_clusters)(int smem_bytes, int splits, int* clusters) = nullptr;

  int smem_bytes(int stages, int k_buffers) const {
    return fixed_smem_bytes + stages * stage_smem_bytes + (k_buffers - 1) * k_buffer_smem_bytes;
  }
};

// The portable kernel's variant for row source Rows (an entry of KernelRows) with
// the smallest tile of 16, 32 or 64 rows that holds `rows`: defined in
// sparse_attention_variant.cuh, instantiated in the generated attention_<Rows>.cu.
template <class Rows>
AttentionVariant attention_variant_of(int rows);

// The Hopper kernel (src/cuda/sm90): 64-row tiles of one token's heads, wgmma.
// Built only when the build's architectures include sm_90a.
bool sm90_kernels_built();
AttentionVariant sm90_attention_variant(LoaderKind kind);

// attention_variant_of<Rows> for the row source `kind` (src/cuda/sm80/attention_variants.cc).
AttentionVariant attention_variant(LoaderKind kind, int rows);

// Merges the num_splits partials of every (token, head) and adds the sink.
// programmatic (sm90+): launched as a programmatic dependent of the grid before
// it on the stream (the attention grid), which it waits for on the device.
cudaError_t launch_split_combine(const SparseAttentionParams& params, bool programmatic, cudaStream_t stream);

}  // namespace smla::cuda
