// Internal: the one params struct of the CUDA sparse-attention kernels (decode,
// direct-from-cache prefill, and prefill over a flat bf16 workspace all use it).
// Raw pointers and strides only; strides are in elements unless named _bytes.
#pragma once

#include <cstdint>

namespace smla::cuda {

inline constexpr int kKeysPerTile = 32;  // keys per pipeline step of the attention kernel
inline constexpr int kSm90KeysPerTile = 64;  // the same in the sm90 kernel
inline constexpr int kMaxKvStages = 4;   // raw KV tiles in flight (cp.async ring)
inline constexpr int kMaxSplits = 64;    // key splits of one (token, head); the combine reads two per lane
inline constexpr int kValueDim = 512;    // d_v of every supported format
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// One KV source (the main/sliding-window cache or the extra/compressed one).
struct KvSourceParams {
  const std::uint8_t* pages = nullptr;  // first byte of page 0
  std::int64_t page_stride_bytes = 0;   // taken from the tensor, never recomputed
  std::int64_t row_stride_bytes = 0;    // plain-row formats: bytes between tokens of a page
  std::int64_t page_size = 1;           // tokens per page
  std::int64_t num_slots = 0;           // indices outside [0, num_slots) are never read
  float fp8_scale = 1.0f;               // per-tensor scale of fp8 rows
  const std::int32_t* indices = nullptr;  // [T, topk] global slots
  std::int64_t stride_indices_t = 0;
  int topk = 0;
  const std::int32_t* lengths = nullptr;  // [T], may be nullptr (= topk); clamped to [0, topk]
  std::int64_t stride_lengths_t = 0;
};

struct SparseAttentionParams {
  const std::uint16_t* q = nullptr;  // [T, h_q, d_qk] bf16 bits
  std::int64_t stride_q_t = 0;
  std::int64_t stride_q_h = 0;
  bool q_aligned_16 = false;  // base and strides allow 16-byte loads
  // sm90 kernel: Q's head blocks by the tensor memory accelerator, through this
  // CUtensorMap (set by the sm90 launch where the driver encodes one for Q's layout).
  bool q_by_tensor_map = false;
  alignas(128) std::uint8_t q_tensor_map[128] = {};
  int num_tokens = 0;         // T
  int num_heads = 0;          // h_q
  // sm90 kernels: query heads a 64-row CTA attends, head block b holding heads
  // [b * head_block_rows, ...); 64, or 32 / 16 for unpaired FP8 CTAs (AttentionPlan).
  int head_block_rows = 64;
  KvSourceParams source[2];
  int num_sources = 1;
  int kv_stages = 1;  // 1..kMaxKvStages raw KV tile buffers; the dynamic shared memory holds that many
  int k_buffers = 1;  // 1 or 2 expanded K tiles in shared memory (2: expansion overlaps P V)
  bool prefetch_rows = false;  // sm90 kernel: ask L2 for rows a few tiles ahead (CTAs of few keys)
  // sm90 FP8 kernel, unpaired: the splits of a (token, head block) run as one
  // cluster that merges their partials after the cluster's barrier (no combine
  // launch); set by the launch (LaunchFlags::fold_splits). In the padding before
  // stride_sink, so the struct stays 896 bytes (after partial_max it made 1024,
  // which measured no slower, docs/PERF.md, session 37).
  bool fold_splits = false;
  const float* sink = nullptr;  // [h_q] natural-log units, may be nullptr (= -inf)
  std::int64_t stride_sink = 1;
  // Scores and row maxima are raw dot products <q, k>; the scale multiplies their
  // differences, p = exp2((s - m) * scale_log2), so a scaled logit beyond f32 never
  // turns into inf - inf (docs/attention.md, non-finite values and overflow).
  float scale_log2 = 0.0f;     // softmax_scale * log2(e), saturated at FLT_MAX
  float softmax_scale = 0.0f;  // natural-log scale: lse = m * softmax_scale + ln(sum)

  std::uint16_t* out = nullptr;  // [T, h_q, 512] bf16 bits
  std::int64_t stride_out_t = 0;
  std::int64_t stride_out_h = 0;
  bool out_aligned_4 = false;   // bf16 pairs may be stored as one 32-bit word
  bool out_aligned_16 = false;  // rows and every 8-value unit start on 16 bytes (sm90 staged output)
  // sm90 kernel of copied rows: the output rows leave by tensor stores through this
  // CUtensorMap (out_box_rows-head x 64-value boxes: 16, a warp's, or 64, a
  // warpgroup's), set by its launch.
  bool out_by_tensor_map = false;
  int out_box_rows = 16;
  alignas(128) std::uint8_t out_tensor_map[128] = {};
  float* lse = nullptr;        // [T, h_q] natural log, sink excluded, +inf when empty; may be nullptr
  std::int64_t stride_lse_t = 0;
  std::int64_t stride_lse_h = 0;
  float* max_logits = nullptr;  // [T, h_q] scaled natural-log logits, -inf when empty; may be nullptr
  std::int64_t stride_max_t = 0;
  std::int64_t stride_max_h = 0;

  // Split over keys: with num_splits > 1 every split writes its f32 partial
  // (normalised by its own sum), its sum of exp2((s - m) * scale_log2) and its raw
  // max m; the combine kernel merges them. (A per-split lse could overflow f32.)
  int num_splits = 1;
  float* partial_out = nullptr;  // [num_splits, T, h_q, 512]; not written where partial_sum is 0
  float* partial_sum = nullptr;  // [num_splits, T, h_q]: 0 when the split attends nothing, NaN when a score was
  float* partial_max = nullptr;  // [num_splits, T, h_q]: raw dot products, -inf when nothing attended

  // Packed MTP (pack_tokens > 1): one CTA holds pack_tokens consecutive tokens x
  // all h_q heads (row r = token r / h_q, head r % h_q). Its keys are the union
  // list the pack prepass built in the workspace; a row attends a key only when
  // its token's bit is set in the key's mask.
  int pack_tokens = 1;
  int pack_capacity = 0;                     // union entries per group: pack_tokens * (main + extra width)
  std::uint32_t* pack_keys = nullptr;  // [T / pack_tokens, pack_capacity][2]: source << 31 | slot, mask
  int* pack_counts = nullptr;  // [T / pack_tokens] union entries in use

  // sm90 kernel, staged FP8 rows (src/cuda/staged_rows.h): when set, the grid does
  // its work only if *run_gate == run_gate_value, a word the staging passes write
  // on the device (0: the rows fit the staging buffer; 1: they did not).
  const std::uint32_t* run_gate = nullptr;
  std::uint32_t run_gate_value = 0;

  // sm90 FP8 kernel: the tokens in the order the grid runs them, most key tiles
  // first (src/cuda/token_order.h), so that the short ones fill the last wave;
  // nullptr: grid order. A caller's buffer may hold anything: a value outside
  // [0, num_tokens) runs the token of its own place.
  const int* token_order = nullptr;
};

inline constexpr int kMaxPackTokens = 16;      // token masks share a 32-bit word with the source and load bits
inline constexpr int kMaxPackEntries = 4096;   // the prepass hashes a group's entries in shared memory

}  // namespace smla::cuda
