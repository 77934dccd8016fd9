// Internal: the CPU attention kernel's parameters, one POD struct of raw
// pointers and element strides built from checked SparseDecodeArgs or
// SparsePrefillArgs (cpu_attention.cc), so the SIMD code never sees a
// TensorView and decode and prefill share one kernel.
#pragma once

#include <cstdint>

#include "smla/kv_format.h"

namespace smla::cpu {

// Where a query token's candidate rows come from.
enum class RowSource : std::uint8_t {
  kPagedCache,  // a paged KvCacheView in `format`
  kFlatBf16,    // the prefill workspace: rows [num_rows, d_qk] bf16
};

// One index set of a query token: indices [T, width] i32 into one row store.
struct KeySetParams {
  const std::int32_t* indices = nullptr;  // [T, width]; nullptr: no such set
  std::int64_t stride_indices_t = 0;
  std::int64_t width = 0;
  const std::int32_t* lengths = nullptr;  // [T]; nullptr: width for every token
  std::int64_t stride_lengths = 0;
  // Rows: for kPagedCache, slot s is entry s % page_size of page s / page_size.
  const std::uint8_t* base = nullptr;
  std::int64_t num_rows = 0;         // valid index range is [0, num_rows)
  std::int64_t page_size = 1;        // kPagedCache
  std::int64_t page_stride_bytes = 0;  // kPagedCache
  std::int64_t row_stride_bytes = 0;   // kFlatBf16
  float fp8_scale = 1.0f;              // formats with a per-tensor scale (fp8-rows)
};

struct AttentionParams {
  RowSource source = RowSource::kPagedCache;
  KvFormat format = KvFormat::kV4Fp8;  // kPagedCache only; both sets share it
  std::int64_t num_tokens = 0;         // T (decode) or s_q (prefill)
  std::int64_t num_heads = 0;          // h_q
  int d_qk = 0;
  int d_v = 0;
  float softmax_scale = 0.0f;

  const std::uint16_t* q = nullptr;  // [T, h_q, d_qk] bf16
  std::int64_t stride_q_t = 0;
  std::int64_t stride_q_h = 0;
  const float* sink = nullptr;  // [h_q], may be nullptr (= -inf)
  std::int64_t stride_sink = 0;

  KeySetParams sets[2];  // main (or the prefill indices), then extra
  int num_sets = 1;

  std::uint16_t* out = nullptr;  // [T, h_q, d_v] bf16
  std::int64_t stride_out_t = 0;
  std::int64_t stride_out_h = 0;
  float* lse = nullptr;  // [T, h_q], may be nullptr; +inf for empty rows
  std::int64_t stride_lse_t = 0;
  std::int64_t stride_lse_h = 0;
  float* max_logits = nullptr;  // [T, h_q], may be nullptr; -inf for empty rows
  std::int64_t stride_max_t = 0;
  std::int64_t stride_max_h = 0;
};

// Computes heads [head_begin, head_end) of query token `token` with the best
// SIMD target of this CPU (or the one forced by force_simd_target).
void attend_token_heads(const AttentionParams& params, std::int64_t token, std::int64_t head_begin,
                        std::int64_t head_end);

}  // namespace smla::cpu
