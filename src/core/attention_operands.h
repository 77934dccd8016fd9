// Internal: the operands of one attention call as raw pointers and strides,
// built once from validated SparseDecodeArgs / SparsePrefillArgs for every
// backend. The CPU kernel reads them as they are; the CUDA backend narrows them
// into its kernels' SparseAttentionParams and adds its own alignment facts.
// Strides are in elements unless named _bytes; page strides come from the
// tensors, never recomputed.
#pragma once

#include <cstdint>

#include "smla/attention.h"
#include "smla/kv_format.h"
#include "src/core/attention_validate.h"

namespace smla::detail {

// Where a call's candidate rows live.
enum class RowSource : std::uint8_t {
  kPagedCache,  // KvCacheViews in the operands' format
  kFlatBf16,    // prefill's workspace [s_kv, d_qk] bf16, taken as one page of s_kv rows
};

// One index set of the query tokens, indices [T, width] i32 into one row store.
// Slot s is entry s % page_size of page s / page_size.
struct KeySetOperands {
  const char* argument_name = "";       // "main_cache", "extra_cache" or "kv", for error messages
  const std::uint8_t* pages = nullptr;  // first byte of page 0
  std::int64_t num_pages = 1;
  std::int64_t page_size = 1;           // tokens per page, >= 1
  std::int64_t page_stride_bytes = 0;   // 0 for the flat workspace
  std::int64_t row_stride_bytes = 0;    // the tensor's stride between the tokens of a page
  std::int64_t num_slots = 0;           // indices outside [0, num_slots) are never read
  float fp8_scale = 1.0f;               // formats with a per-tensor scale (fp8-rows)
  const std::int32_t* indices = nullptr;  // [T, width]
  std::int64_t stride_indices_t = 0;
  std::int64_t width = 0;
  const std::int32_t* lengths = nullptr;  // [T], may be nullptr (= width for every token)
  std::int64_t stride_lengths_t = 0;
};

struct AttentionOperands {
  RowSource source = RowSource::kPagedCache;
  KvFormat format = KvFormat::kV4Fp8;  // kPagedCache only; both sets share it
  std::int64_t num_tokens = 0;         // T (decode) or s_q (prefill)
  std::int64_t num_heads = 0;          // h_q
  int d_qk = 0;
  int d_v = 0;
  float softmax_scale = 0.0f;

  const std::uint16_t* q = nullptr;  // [T, h_q, d_qk] bf16 bits
  std::int64_t stride_q_t = 0;
  std::int64_t stride_q_h = 0;
  const float* sink = nullptr;  // [h_q], may be nullptr (= -inf)
  std::int64_t stride_sink = 1;

  KeySetOperands sets[2];  // main (or the prefill indices), then extra
  int num_sets = 1;

  std::uint16_t* out = nullptr;  // [T, h_q, d_v] bf16 bits
  std::int64_t stride_out_t = 0;
  std::int64_t stride_out_h = 0;
  float* lse = nullptr;  // [T, h_q], may be nullptr; +inf for empty rows
  std::int64_t stride_lse_t = 0;
  std::int64_t stride_lse_h = 0;
  float* max_logits = nullptr;  // [T, h_q], may be nullptr; -inf for empty rows
  std::int64_t stride_max_t = 0;
  std::int64_t stride_max_h = 0;
};

AttentionOperands decode_operands(const SparseDecodeArgs& args, const DecodeShape& shape);
AttentionOperands prefill_operands(const SparsePrefillArgs& args, const PrefillShape& shape);

}  // namespace smla::detail
