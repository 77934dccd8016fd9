// Internal: argument validation shared by every backend of the attention ops.
#pragma once

#include <cstdint>

#include "smla/attention.h"

namespace smla::detail {

struct DecodeShape {
  std::int64_t num_tokens = 0;  // T
  std::int64_t num_heads = 0;   // h_q
  int d_qk = 0;
  int d_v = 0;
  std::int64_t main_topk = 0;
  std::int64_t extra_topk = 0;  // 0 when there is no extra cache
  bool has_extra = false;
  bool has_main_lengths = false;
  bool has_extra_lengths = false;
  bool has_sink = false;
  bool has_lse = false;
};

struct PrefillShape {
  std::int64_t num_queries = 0;  // s_q
  std::int64_t num_kv = 0;       // s_kv
  std::int64_t num_heads = 0;
  int d_qk = 0;
  int d_v = 0;
  std::int64_t topk = 0;
  bool has_topk_length = false;
  bool has_sink = false;
  bool has_max_logits = false;
  bool has_lse = false;
};

// Checks every tensor (presence, dtype, rank, shape agreement, last dim
// contiguous, device), the format/head-dim agreement and the lengths against
// the index widths. Lengths values are checked too: 0 <= len <= width.
// Decode: queries_per_request must be >= 1 and divide T.
Expected<DecodeShape> validate_sparse_decode(const SparseDecodeArgs& args, DeviceKind expected_device);
Expected<PrefillShape> validate_sparse_prefill(const SparsePrefillArgs& args, DeviceKind expected_device);

}  // namespace smla::detail
