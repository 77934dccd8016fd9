// Internal: device helpers shared by the metadata kernels. The per-value rules
// come from src/core/metadata/metadata_rules.h (the host builder's rules); these
// add the warp-parallel forms of its sequential loops.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "src/core/metadata/metadata_rules.h"
#include "src/cuda/metadata/metadata_params.h"

namespace smla::cuda {

inline constexpr int kWarp = 32;

// Row `req` of a table; a request outside [0, rows) or an absent table yields
// the empty row, whose every lookup is -1.
__device__ __forceinline__ detail::BlockTableRow device_table_row(const DeviceTable& t, std::int64_t req) {
  if (t.data == nullptr || req < 0 || req >= t.rows) return {};
  return {t.data + req * t.row_stride, t.col_stride, t.cols};
}

// table_slot with a precomputed page divider (same values).
__device__ __forceinline__ std::int64_t device_slot(const detail::BlockTableRow& row, const detail::PageDivider& page,
                                                    std::int64_t logical) {
  if (row.data == nullptr || logical < 0) return -1;
  const std::int64_t col = page.div(logical);
  if (col >= row.num_cols) return -1;
  const std::int64_t block = row.data[col * row.col_stride];
  if (block < 0) return -1;
  return block * page.page + (logical - col * page.page);
}

// An i32 index row entry: slots that do not fit i32 are -1, as in write_table_run.
__device__ __forceinline__ std::int32_t as_index(std::int64_t slot) {
  return slot < 0 || slot > detail::kMaxI32 ? -1 : static_cast<std::int32_t>(slot);
}

__device__ __forceinline__ std::int64_t load_i32(const std::int32_t* p, std::int64_t stride, std::int64_t i) {
  return p[i * stride];
}

// Warp-parallel left compaction: value_at(k) for k < count gives the value to
// keep, or -1 to drop it; kept values are written in order to out[0, kept).
// Every lane calls it; returns kept (same on every lane).
template <class ValueAt>
__device__ std::int64_t warp_compact(ValueAt value_at, std::int64_t count, std::int32_t* out, std::int64_t out_stride,
                                     int lane) {
  std::int64_t kept = 0;
  for (std::int64_t base = 0; base < count; base += kWarp) {
    const std::int64_t k = base + lane;
    const std::int64_t value = k < count ? value_at(k) : -1;
    const bool keep = value >= 0;
    const unsigned mask = __ballot_sync(0xffffffffu, keep);
    if (keep) out[(kept + __popc(mask & ((1u << lane) - 1u))) * out_stride] = static_cast<std::int32_t>(value);
    kept += __popc(mask);
  }
  return kept;
}

// convert_compact_row on a warp: entries local_at(k), k < count, in [0, limit)
// that resolve through the table to an i32 slot, compacted; out[kept, width) = -1.
template <class LocalAt>
__device__ std::int32_t warp_convert_compact(const detail::BlockTableRow& row, const detail::PageDivider& page,
                                             LocalAt local_at, std::int64_t count, std::int64_t limit,
                                             std::int64_t width, std::int32_t* out, std::int64_t out_stride,
                                             int lane) {
  auto slot_at = [&](std::int64_t k) -> std::int64_t {
    const std::int64_t l = local_at(k);
    const std::int64_t slot = l < limit ? device_slot(row, page, l) : -1;
    return slot <= detail::kMaxI32 ? slot : -1;
  };
  const std::int64_t kept = warp_compact(slot_at, count, out, out_stride, lane);
  for (std::int64_t j = kept + lane; j < width; j += kWarp) out[j * out_stride] = -1;
  return static_cast<std::int32_t>(kept);
}

// Warp-wide inclusive prefix sum.
__device__ __forceinline__ std::int64_t warp_inclusive_sum(std::int64_t v, int lane) {
  for (int d = 1; d < kWarp; d *= 2) {
    const std::int64_t up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

// Block-wide inclusive prefix sum (blockDim.x a multiple of 32, at most 1024);
// *total receives the block's sum. `scratch` holds 33 values in shared memory.
__device__ __forceinline__ std::int64_t block_inclusive_sum(std::int64_t v, std::int64_t* scratch,
                                                            std::int64_t* total) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  v = warp_inclusive_sum(v, lane);
  if (lane == kWarp - 1) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    std::int64_t w = lane < warps ? scratch[lane] : 0;
    w = warp_inclusive_sum(w, lane);
    if (lane < warps) scratch[lane] = w;
    if (lane == kWarp - 1) scratch[kWarp] = w;
  }
  __syncthreads();
  if (warp > 0) v += scratch[warp - 1];
  *total = scratch[kWarp];
  __syncthreads();  // scratch is reused by the next call
  return v;
}

// For the token rows [j0, j0 + kRows) of a block (tokens counted from request
// req_begin), the request owning each row and the row of its first token, by
// scanning max(query_len, 0) of requests [req_begin, req_end) in block-sized
// chunks (no scratch buffer). Rows no request owns get -1. All threads call it.
template <int kRows>
__device__ void block_locate_rows(const DeviceBatch& b, std::int64_t req_begin, std::int64_t req_end,
                                  std::int64_t j0, std::int64_t* row_req, std::int64_t* row_start,
                                  std::int64_t* scan_scratch) {
  if (threadIdx.x < kRows) row_req[threadIdx.x] = -1;
  __syncthreads();
  const std::int64_t j1 = j0 + kRows;
  std::int64_t carry = 0;  // uniform across the block
  for (std::int64_t base = req_begin; base < req_end && carry < j1; base += blockDim.x) {
    const std::int64_t r = base + threadIdx.x;
    const std::int64_t q = r < req_end ? detail::max64(load_i32(b.query_lens, b.query_lens_stride, r), 0) : 0;
    std::int64_t chunk_total = 0;
    const std::int64_t end = carry + block_inclusive_sum(q, scan_scratch, &chunk_total);
    const std::int64_t start = end - q;
    for (std::int64_t u = detail::max64(start, j0); u < detail::min64(end, j1); ++u) {
      row_req[u - j0] = r;
      row_start[u - j0] = start;
    }
    carry += chunk_total;
  }
  __syncthreads();
}

}  // namespace smla::cuda
