// Internal: kernel parameters of the device metadata ops (the Context forms of smla/metadata.h)
// and their launchers. The host entry points (cuda_metadata.cc) validate the
// views and fill these raw-pointer structs; the .cu files hold the kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smla/kv_format.h"
#include "src/core/kv_rows.h"

namespace smla::cuda {

// A block table: rows [0, rows) of cols columns; data == nullptr = absent.
struct DeviceTable {
  const std::int32_t* data = nullptr;
  std::int64_t row_stride = 0, col_stride = 1;
  std::int64_t rows = 0, cols = 0;
};

// The batch as device pointers (query_lens / seq_lens [num_reqs], token_valid [num_tokens] or null).
struct DeviceBatch {
  const std::int32_t* query_lens = nullptr;
  std::int64_t query_lens_stride = 1;
  const std::int32_t* seq_lens = nullptr;
  std::int64_t seq_lens_stride = 1;
  const std::uint8_t* token_valid = nullptr;
  std::int64_t token_valid_stride = 1;
  std::int64_t num_reqs = 0;
  std::int64_t num_tokens = 0;  // capacity T
  DeviceTable swa, c4, c128;
};

struct StepMetadataParams {
  DeviceBatch batch;
  std::int64_t window = 0, max_model_len = 0, decode_threshold = 1;
  std::int64_t swa_page = 0, c4_block = 0, c128_block = 0;
  std::int64_t c128_width = 0, c128_active = 0;

  std::int32_t* query_start_loc = nullptr;
  std::int64_t stride_query_start_loc = 1;
  std::int32_t* token_to_req = nullptr;
  std::int64_t stride_token_to_req = 1;
  std::int64_t* positions = nullptr;
  std::int64_t stride_positions = 1;
  std::uint8_t* is_valid_token = nullptr;
  std::int64_t stride_is_valid_token = 1;
  std::int64_t* swa_slot_mapping = nullptr;
  std::int64_t stride_swa_slot_mapping = 1;
  std::int32_t* swa_indices = nullptr;
  std::int64_t stride_swa_indices_t = 0, stride_swa_indices_c = 1;
  std::int32_t* swa_lens = nullptr;
  std::int64_t stride_swa_lens = 1;
  std::int32_t* prefill_gather_lens = nullptr;
  std::int64_t stride_prefill_gather_lens = 1;
  std::int64_t* c4_slot_mapping = nullptr;  // null without a ratio-4 table
  std::int64_t stride_c4_slot_mapping = 1;
  std::int64_t* c128_slot_mapping = nullptr;  // the C128 fields are null without a ratio-128 table
  std::int64_t stride_c128_slot_mapping = 1;
  std::int32_t* c128a_decode_indices = nullptr;
  std::int64_t stride_c128a_decode_t = 0, stride_c128a_decode_c = 1;
  std::int32_t* c128a_decode_lens = nullptr;
  std::int64_t stride_c128a_decode_lens = 1;
  std::int32_t* c128a_prefill_indices = nullptr;
  std::int64_t stride_c128a_prefill_t = 0, stride_c128a_prefill_c = 1;
  std::int64_t* counts = nullptr;
  std::int64_t stride_counts = 1;
};

struct C4aGlobalParams {
  const std::int32_t* local = nullptr;
  std::int64_t stride_local_t = 0, stride_local_k = 1;
  const std::int32_t* token_to_req = nullptr;
  std::int64_t stride_token_to_req = 1;
  const std::uint8_t* is_valid_token = nullptr;  // null = all valid
  std::int64_t stride_is_valid_token = 1;
  DeviceTable table;
  std::int64_t block_size = 1;
  std::int32_t* out = nullptr;
  std::int64_t stride_out_t = 0, stride_out_k = 1;
  std::int32_t* lens = nullptr;
  std::int64_t stride_lens = 1;
  std::int64_t num_rows = 0, topk = 0;
};

struct V32GlobalParams {
  const std::int32_t* req_indices = nullptr;
  std::int64_t stride_in_t = 0, stride_in_k = 1;
  const std::int32_t* req_id = nullptr;
  std::int64_t stride_req_id = 1;
  DeviceTable table;
  std::int64_t block_size = 1, block_stride_rows = 1;
  std::int32_t* out = nullptr;
  std::int64_t stride_out_t = 0, stride_out_k = 1;
  std::int32_t* valid_counts = nullptr;  // null = not wanted
  std::int64_t stride_valid_counts = 1;
  std::int64_t num_rows = 0, topk = 0;
};

struct MixedIndicesParams {
  DeviceBatch batch;
  std::int64_t window = 0, swa_page = 0;
  int ratio = 1;                      // 1, 4 or 128
  DeviceTable group;                  // the compressed group's table (absent for SWA-only)
  std::int64_t group_block = 1;       // entries per compressed page
  std::int64_t topk_width = 0;        // K (C4A), C128W (C128A), 0
  std::int64_t packed_topk = 0;       // PK = roundup4(topk_width)
  std::int64_t c128_active = 0;       // entries a C128A row may hold
  const std::int32_t* local_topk = nullptr;  // C4A only: [T, K]
  std::int64_t stride_local_t = 0, stride_local_k = 1;
  std::int32_t* out = nullptr;  // [T, W + PK], contiguous rows
  std::int64_t stride_out_t = 0;
  std::int32_t* lens = nullptr;
  std::int64_t stride_lens = 1;
};

// Rows of one request a dequantize-and-gather block covers: about 256 threads, one
// per decode unit (8 values) of a row (gather_kernels.cu).
inline constexpr int gather_rows_per_block(std::int64_t head_dim) {
  const std::int64_t units = head_dim / detail::kDecodeUnit;
  return static_cast<int>(256 / units > 0 ? 256 / units : 1);
}

struct CombineParams {
  DeviceBatch batch;                       // query_lens / seq_lens only
  std::int64_t req_begin = 0, req_end = 0;  // the chunk's requests
  std::int64_t rows = 0;                   // the chunk's tokens (index rows written)
  std::int64_t window = 0;
  int ratio = 1;
  const std::int32_t* topk = nullptr;  // [rows, topk_width] local entries; null for SWA-only
  std::int64_t stride_topk_t = 0, stride_topk_k = 1;
  std::int64_t topk_width = 0;
  std::int64_t compressed_rows = 0, workspace_rows = 0;  // N, M
  std::int32_t* out = nullptr;
  std::int64_t stride_out_t = 0, stride_out_c = 1;
  std::int64_t width = 0;  // combined_index_width
  std::int32_t* lens = nullptr;
  std::int64_t stride_lens = 1;
};

struct GatherParams {
  const std::uint8_t* pages = nullptr;
  std::int64_t page_stride_bytes = 0, page_size = 1, num_pages = 0;
  float fp8_scale = 1.0f;
  const std::int32_t* seq_lens = nullptr;
  std::int64_t stride_seq_lens = 1;
  std::int64_t seq_div = 1;  // gathers entries of seq_len / seq_div (a compressed group)
  const std::int32_t* gather_lens = nullptr;  // null = gather whole seq_len
  std::int64_t stride_gather_lens = 1;
  const std::int32_t* query_lens = nullptr;  // non-null: gather = prefill_gather_len(seq_len, q, window)
  std::int64_t stride_query_lens = 1;
  std::int64_t window = 0;
  DeviceTable table;
  std::int64_t offset = 0;
  std::uint16_t* out = nullptr;  // bf16 bits [B, M, head_dim]
  std::int64_t stride_out_b = 0, stride_out_m = 0, stride_out_d = 1;
  std::int64_t out_rows = 0;  // M
  std::int64_t batch = 0;
};

cudaError_t launch_step_metadata(const StepMetadataParams& p, cudaStream_t stream);
cudaError_t launch_c4a_global(const C4aGlobalParams& p, cudaStream_t stream);
cudaError_t launch_v32_global(const V32GlobalParams& p, cudaStream_t stream);
cudaError_t launch_mixed_indices(const MixedIndicesParams& p, cudaStream_t stream);
cudaError_t launch_combine_indices(const CombineParams& p, cudaStream_t stream);
cudaError_t launch_dequantize_gather(KvFormat format, const GatherParams& p, cudaStream_t stream);

}  // namespace smla::cuda
