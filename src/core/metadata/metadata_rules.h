// Internal: the per-token / per-row rules of the step metadata (spec 3 and 4),
// as host-device inline functions over raw pointers and element strides, so
// the CPU builder and a future CUDA kernel (one thread block per token) apply
// exactly the same contract. Callers validate shapes first; these functions
// still never index a block table outside [0, num_cols) and turn a negative
// block id, or a slot that would not fit an i32 index, into -1.
#pragma once

#include <cstdint>

#include "smla/numeric.h"  // SMLA_HOST_DEVICE

namespace smla::detail {

inline constexpr std::int64_t kMaxI32 = 2147483647;

SMLA_HOST_DEVICE std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
SMLA_HOST_DEVICE std::int64_t roundup(std::int64_t a, std::int64_t b) { return cdiv(a, b) * b; }
SMLA_HOST_DEVICE std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
SMLA_HOST_DEVICE std::int64_t max64(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

// Absolute position of the i-th query token of a request.
SMLA_HOST_DEVICE std::int64_t token_position(std::int64_t seq_len, std::int64_t query_len, std::int64_t i) {
  return seq_len - query_len + i;
}

// Window of a token (spec 4.1): positions [pos - len + 1, pos], len = min(pos + 1, W).
SMLA_HOST_DEVICE std::int64_t window_len(std::int64_t pos, std::int64_t window) { return min64(pos + 1, window); }

// Raw tokens a prefill gathers into its workspace (spec 3.2).
SMLA_HOST_DEVICE std::int64_t prefill_gather_len(std::int64_t seq_len, std::int64_t query_len, std::int64_t window) {
  return query_len + min64(seq_len - query_len, window - 1);
}

// Compressed entries visible to a token at pos: those closing at or before pos.
SMLA_HOST_DEVICE std::int64_t visible_compressed(std::int64_t pos, std::int64_t ratio) { return (pos + 1) / ratio; }

// One request's row of a block table. data == nullptr stands for a request
// outside the table: every lookup then yields -1.
struct BlockTableRow {
  const std::int32_t* data = nullptr;
  std::int64_t col_stride = 1;
  std::int64_t num_cols = 0;
};

// Division by a page size, by shift when it is a power of two (every
// production size: 64, 2); the per-entry conversions are division bound.
struct PageDivider {
  std::int64_t page = 1;
  int shift = -1;  // -1: not a power of two

  SMLA_HOST_DEVICE explicit PageDivider(std::int64_t page_size) : page(page_size) {
    if (page_size > 0 && (page_size & (page_size - 1)) == 0) {
      shift = 0;
      while ((std::int64_t{1} << shift) < page_size) ++shift;
    }
  }
  SMLA_HOST_DEVICE std::int64_t div(std::int64_t x) const { return shift >= 0 ? x >> shift : x / page; }
};

// Slot of `logical` (a token position or a compressed entry index) through a
// table whose pages hold `page_size` entries; -1 when the lookup is invalid.
SMLA_HOST_DEVICE std::int64_t table_slot(const BlockTableRow& row, std::int64_t page_size, std::int64_t logical) {
  if (row.data == nullptr || logical < 0) return -1;
  const std::int64_t col = logical / page_size;
  if (col >= row.num_cols) return -1;
  const std::int64_t block = row.data[col * row.col_stride];
  if (block < 0) return -1;
  return block * page_size + logical % page_size;
}

// Contiguous rows (the usual case) get separate loops the compiler vectorizes.
SMLA_HOST_DEVICE void fill_row(std::int32_t* out, std::int64_t out_stride, std::int64_t begin, std::int64_t end,
                               std::int32_t value) {
  if (out_stride == 1) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = value;
  } else {
    for (std::int64_t i = begin; i < end; ++i) out[i * out_stride] = value;
  }
}

// out[k] = first + k for k < count; the caller ensures first + count - 1 fits i32.
SMLA_HOST_DEVICE void write_iota(std::int32_t* out, std::int64_t out_stride, std::int64_t count, std::int64_t first) {
  const auto base = static_cast<std::int32_t>(first);
  if (out_stride == 1) {
    for (std::int64_t k = 0; k < count; ++k) out[k] = base + static_cast<std::int32_t>(k);
  } else {
    for (std::int64_t k = 0; k < count; ++k) out[k * out_stride] = base + static_cast<std::int32_t>(k);
  }
}

// Slots of the consecutive logical entries [first, first + count) into
// out[0, count): table_slot per entry, -1 where it is invalid or beyond i32,
// with one table read and one division per page (the builder's hot loop).
SMLA_HOST_DEVICE void write_table_run(const BlockTableRow& row, std::int64_t page_size, std::int64_t first,
                                      std::int64_t count, std::int32_t* out, std::int64_t out_stride) {
  std::int64_t i = 0;
  while (i < count) {
    const std::int64_t logical = first + i;
    if (logical < 0) {
      out[(i++) * out_stride] = -1;
      continue;
    }
    const std::int64_t col = logical / page_size;
    const std::int64_t offset = logical - col * page_size;
    const std::int64_t span = min64(page_size - offset, count - i);
    std::int64_t base = -1;
    if (row.data != nullptr && col < row.num_cols) {
      const std::int64_t block = row.data[col * row.col_stride];
      if (block >= 0) base = block * page_size + offset;
    }
    std::int32_t* dst = out + i * out_stride;
    if (base < 0) {
      fill_row(dst, out_stride, 0, span, -1);
    } else if (base + span - 1 <= kMaxI32) {
      write_iota(dst, out_stride, span, base);
    } else {
      for (std::int64_t k = 0; k < span; ++k)
        dst[k * out_stride] = base + k > kMaxI32 ? -1 : static_cast<std::int32_t>(base + k);
    }
    i += span;
  }
}

// Compressed slot a token writes (spec 4.8): entry pos // r, only when the
// token closes it ((pos + 1) % r == 0); -1 otherwise.
SMLA_HOST_DEVICE std::int64_t compressed_slot_mapping(const BlockTableRow& row, std::int64_t ratio,
                                                      std::int64_t storage_block_size, std::int64_t pos) {
  if (pos < 0 || (pos + 1) % ratio != 0) return -1;
  return table_slot(row, storage_block_size, pos / ratio);
}

// Window row (spec 4.1): slots of positions pos - len + 1 .. pos, oldest
// first, then -1 up to `width`. Returns len.
SMLA_HOST_DEVICE std::int32_t write_window_row(const BlockTableRow& row, std::int64_t page_size, std::int64_t pos,
                                               std::int64_t window, std::int64_t width, std::int32_t* out,
                                               std::int64_t out_stride) {
  const std::int64_t len = window_len(pos, window);
  write_table_run(row, page_size, pos - len + 1, len, out, out_stride);
  for (std::int64_t i = len; i < width; ++i) out[i * out_stride] = -1;
  return static_cast<std::int32_t>(len);
}

// C128A decode row (spec 4.3): global slots of entries 0..n-1, then -1 up to width.
SMLA_HOST_DEVICE void write_c128a_decode_row(const BlockTableRow& row, std::int64_t storage_block_size, std::int64_t n,
                                             std::int64_t width, std::int32_t* out, std::int64_t out_stride) {
  write_table_run(row, storage_block_size, 0, n, out, out_stride);
  for (std::int64_t j = n; j < width; ++j) out[j * out_stride] = -1;
}

// C128A prefill row (spec 4.3): local entries 0..n-1, then -1 up to width.
SMLA_HOST_DEVICE void write_c128a_local_row(std::int64_t n, std::int64_t width, std::int32_t* out,
                                            std::int64_t out_stride) {
  write_iota(out, out_stride, n, 0);
  fill_row(out, out_stride, n, width, -1);
}

// Converts local compressed indices to global slots (spec 4.2, bounds-hardened):
// entries of local[0, count) that are in [0, limit) and resolve through the
// table are written left-compacted; the rest of out[0, width) becomes -1.
// Requires count <= width. Returns the number written.
SMLA_HOST_DEVICE std::int32_t convert_compact_row(const BlockTableRow& row, std::int64_t storage_block_size,
                                                  const std::int32_t* local, std::int64_t local_stride,
                                                  std::int64_t count, std::int64_t limit, std::int64_t width,
                                                  std::int32_t* out, std::int64_t out_stride) {
  std::int64_t kept = 0;
  const PageDivider divider(storage_block_size);
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t l = local[k * local_stride];
    std::int64_t slot = -1;
    if (row.data != nullptr && l >= 0 && l < limit) {
      const std::int64_t col = divider.div(l);
      if (col < row.num_cols) {
        const std::int64_t block = row.data[col * row.col_stride];
        if (block >= 0) slot = block * storage_block_size + (l - col * storage_block_size);
      }
    }
    // Branch-free compaction: the store at `kept` is overwritten unless kept advances (count <= width).
    out[kept * out_stride] = static_cast<std::int32_t>(slot);
    kept += (slot >= 0 && slot <= kMaxI32) ? 1 : 0;
  }
  fill_row(out, out_stride, kept, width, -1);
  return static_cast<std::int32_t>(kept);
}

// One token's row of the combined prefill indices (spec 4.4). `base` = b * M
// of its request, compressed_rows = N, gather_start = seq_len - gather_len.
// Keeps the first topk_len local entries that are in [0, visible) (compacted),
// then the window rows. Returns the row length.
SMLA_HOST_DEVICE std::int32_t write_combined_row(const std::int32_t* topk, std::int64_t topk_stride,
                                                 std::int64_t topk_width, std::int64_t ratio, std::int64_t pos,
                                                 std::int64_t window, std::int64_t base, std::int64_t compressed_rows,
                                                 std::int64_t gather_start, std::int64_t width, std::int32_t* out,
                                                 std::int64_t out_stride) {
  std::int64_t kept = 0;
  if (topk != nullptr && ratio > 1) {
    const std::int64_t visible = visible_compressed(pos, ratio);
    const std::int64_t topk_len = min64(visible, topk_width);
    for (std::int64_t k = 0; k < topk_len; ++k) {
      const std::int64_t l = topk[k * topk_stride];
      out[kept * out_stride] = static_cast<std::int32_t>(base + l);  // kept only when valid (branch-free)
      kept += (l >= 0 && l < visible) ? 1 : 0;
    }
  }
  const std::int64_t swa_len = window_len(pos, window);
  const std::int64_t first = base + compressed_rows + (pos - swa_len + 1 - gather_start);
  write_iota(out + kept * out_stride, out_stride, swa_len, first);
  fill_row(out, out_stride, kept + swa_len, width, -1);
  return static_cast<std::int32_t>(kept + swa_len);
}

}  // namespace smla::detail
