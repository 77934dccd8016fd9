// Request-local to global index conversions on the device (spec 4.2, 4.6,
// 4.7): one warp per output row, compaction by warp ballot so the surviving
// entries keep their order exactly as the sequential host loop writes them.
#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/metadata/metadata_device.cuh"
#include "src/cuda/metadata/metadata_params.h"

namespace smla::cuda {
namespace {

constexpr int kRowWarps = 8;
constexpr int kThreads = kRowWarps * kWarp;

__device__ __forceinline__ std::int64_t warp_row() {
  return static_cast<std::int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
}

__global__ void __launch_bounds__(kThreads) c4a_global_kernel(const __grid_constant__ C4aGlobalParams p) {
  const std::int64_t t = warp_row();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (t >= p.num_rows) return;
  const detail::BlockTableRow row = device_table_row(p.table, load_i32(p.token_to_req, p.stride_token_to_req, t));
  const detail::PageDivider page(p.block_size);
  const std::int32_t* local = p.local + t * p.stride_local_t;
  auto local_at = [&](std::int64_t k) { return static_cast<std::int64_t>(local[k * p.stride_local_k]); };
  const std::int32_t kept = warp_convert_compact(row, page, local_at, p.topk, detail::kMaxI32, p.topk,
                                                 p.out + t * p.stride_out_t, p.stride_out_k, lane);
  if (lane == 0) {
    const bool valid = p.is_valid_token == nullptr || p.is_valid_token[t * p.stride_is_valid_token] != 0;
    p.lens[t * p.stride_lens] = valid ? kept : 0;
  }
}

__global__ void __launch_bounds__(kThreads) v32_global_kernel(const __grid_constant__ V32GlobalParams p) {
  const std::int64_t t = warp_row();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (t >= p.num_rows) return;
  const detail::BlockTableRow row = device_table_row(p.table, load_i32(p.req_id, p.stride_req_id, t));
  const detail::PageDivider page(p.block_size);
  const std::int32_t* in = p.req_indices + t * p.stride_in_t;
  std::int32_t* out = p.out + t * p.stride_out_t;
  int count = 0;
  for (std::int64_t base = 0; base < p.topk; base += kWarp) {
    const std::int64_t k = base + lane;
    std::int64_t global = -1;
    if (k < p.topk) {
      const std::int64_t tok = in[k * p.stride_in_k];
      const std::int64_t slot = device_slot(row, page, tok);
      // The padded block stride changes the slot, not which column is read.
      if (slot >= 0) global = page.div(slot) * p.block_stride_rows + (tok - page.div(tok) * p.block_size);
      if (global > detail::kMaxI32) global = -1;
      out[k * p.stride_out_k] = static_cast<std::int32_t>(global);
    }
    count += __popc(__ballot_sync(0xffffffffu, global >= 0));
  }
  if (lane == 0 && p.valid_counts != nullptr) p.valid_counts[t * p.stride_valid_counts] = count;
}

// Rows [j0, j0 + kRowWarps) of the mixed layout. The block first finds each
// row's request by scanning query_lens in chunks (no scratch buffer needed).
__global__ void __launch_bounds__(kThreads) mixed_indices_kernel(const __grid_constant__ MixedIndicesParams p) {
  __shared__ std::int64_t scan_scratch[kWarp + 1];
  __shared__ std::int64_t row_req[kRowWarps], row_start[kRowWarps];
  const DeviceBatch& b = p.batch;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kRowWarps;
  block_locate_rows<kRowWarps>(b, 0, b.num_reqs, j0, row_req, row_start, scan_scratch);

  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const std::int64_t j = j0 + warp;
  if (j >= b.num_tokens) return;
  const std::int64_t width = p.window + p.packed_topk;
  std::int32_t* out = p.out + j * p.stride_out_t;
  const std::int64_t req = row_req[warp];
  std::int64_t pos = -1;
  if (req >= 0) {
    const std::int64_t q = load_i32(b.query_lens, b.query_lens_stride, req);
    const std::int64_t s = load_i32(b.seq_lens, b.seq_lens_stride, req);
    pos = detail::token_position(s, q, j - row_start[warp]);
  }
  const bool valid = pos >= 0 && (b.token_valid == nullptr || b.token_valid[j * b.token_valid_stride] != 0);
  if (!valid) {
    for (std::int64_t c = lane; c < width; c += kWarp) out[c] = -1;
    if (lane == 0) p.lens[j * p.stride_lens] = 0;
    return;
  }
  const detail::BlockTableRow swa = device_table_row(b.swa, req);
  const detail::PageDivider swa_page(p.swa_page);
  const std::int64_t window_len = detail::window_len(pos, p.window);
  const std::int64_t window_first = pos - window_len + 1;
  for (std::int64_t c = lane; c < p.window; c += kWarp) {
    out[c] = c < window_len ? as_index(device_slot(swa, swa_page, window_first + c)) : -1;
  }
  std::int32_t kept = 0;
  const std::int64_t visible = detail::visible_compressed(pos, p.ratio);
  const detail::BlockTableRow group = device_table_row(p.group, req);
  const detail::PageDivider group_page(p.group_block);
  if (p.ratio == 4) {
    const std::int32_t* local = p.local_topk + j * p.stride_local_t;
    auto local_at = [&](std::int64_t k) { return static_cast<std::int64_t>(local[k * p.stride_local_k]); };
    kept = warp_convert_compact(group, group_page, local_at, detail::min64(visible, p.topk_width), visible,
                                p.packed_topk, out + p.window, 1, lane);
  } else if (p.ratio == 128) {
    auto local_at = [](std::int64_t k) { return k; };
    kept = warp_convert_compact(group, group_page, local_at, detail::min64(visible, p.c128_active), visible,
                                p.packed_topk, out + p.window, 1, lane);
  }
  if (lane == 0) p.lens[j * p.stride_lens] = static_cast<std::int32_t>(p.window + kept);
}

// Rows of one prefill chunk's combined indices (spec 4.4), as write_combined_row.
__global__ void __launch_bounds__(kThreads) combine_indices_kernel(const __grid_constant__ CombineParams p) {
  __shared__ std::int64_t scan_scratch[kWarp + 1];
  __shared__ std::int64_t row_req[kRowWarps], row_start[kRowWarps];
  const DeviceBatch& b = p.batch;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kRowWarps;
  block_locate_rows<kRowWarps>(b, p.req_begin, p.req_end, j0, row_req, row_start, scan_scratch);

  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const std::int64_t j = j0 + warp;
  if (j >= p.rows) return;
  std::int32_t* out = p.out + j * p.stride_out_t;
  const std::int64_t req = row_req[warp];
  std::int64_t pos = -1, seq_len = 0, query_len = 0;
  if (req >= 0) {
    query_len = load_i32(b.query_lens, b.query_lens_stride, req);
    seq_len = load_i32(b.seq_lens, b.seq_lens_stride, req);
    pos = detail::token_position(seq_len, query_len, j - row_start[warp]);
  }
  if (pos < 0) {
    for (std::int64_t c = lane; c < p.width; c += kWarp) out[c * p.stride_out_c] = -1;
    if (lane == 0) p.lens[j * p.stride_lens] = 0;
    return;
  }
  const std::int64_t base = (req - p.req_begin) * p.workspace_rows;
  const std::int64_t gather_start = seq_len - detail::prefill_gather_len(seq_len, query_len, p.window);
  std::int64_t kept = 0;
  if (p.topk != nullptr) {
    const std::int64_t visible = detail::visible_compressed(pos, p.ratio);
    const std::int32_t* topk = p.topk + j * p.stride_topk_t;
    auto value_at = [&](std::int64_t k) -> std::int64_t {
      const std::int64_t l = topk[k * p.stride_topk_k];
      return l >= 0 && l < visible ? base + l : -1;
    };
    kept = warp_compact(value_at, detail::min64(visible, p.topk_width), out, p.stride_out_c, lane);
  }
  const std::int64_t swa_len = detail::window_len(pos, p.window);
  const std::int64_t first = base + p.compressed_rows + (pos - swa_len + 1 - gather_start);
  for (std::int64_t c = kept + lane; c < p.width; c += kWarp) {
    out[c * p.stride_out_c] = c < kept + swa_len ? static_cast<std::int32_t>(first + (c - kept)) : -1;
  }
  if (lane == 0) p.lens[j * p.stride_lens] = static_cast<std::int32_t>(kept + swa_len);
}

unsigned row_blocks(std::int64_t rows) { return static_cast<unsigned>(detail::cdiv(rows, kRowWarps)); }

}  // namespace

cudaError_t launch_c4a_global(const C4aGlobalParams& p, cudaStream_t stream) {
  if (p.num_rows > 0) c4a_global_kernel<<<row_blocks(p.num_rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_v32_global(const V32GlobalParams& p, cudaStream_t stream) {
  if (p.num_rows > 0) v32_global_kernel<<<row_blocks(p.num_rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_mixed_indices(const MixedIndicesParams& p, cudaStream_t stream) {
  if (p.batch.num_tokens > 0) mixed_indices_kernel<<<row_blocks(p.batch.num_tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_combine_indices(const CombineParams& p, cudaStream_t stream) {
  if (p.rows > 0) combine_indices_kernel<<<row_blocks(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace smla::cuda
