// File: smla/metadata.h
//
// Per-step metadata and index transforms (spec sections 3 and 4): everything a
// serving engine computes once per step, before the attention kernels run.
//
// All functions are pure: they read a BatchDescription and write into
// TensorViews the caller allocated. Each has a host form (host TensorViews,
// no Context: the host path) and a Context form that runs on the context's
// backend (smla/context.h; the registry's Op::kStepMetadata rows): on the host
// backends it is the host form, on cuda the device form described under "On the
// device" below. Sizes come from
// step_metadata_sizes(), so a CUDA-graph user can allocate once for the
// largest step and keep addresses stable; StepMetadata is an owning
// convenience for CPU users. Every entry validates all of its inputs before it
// writes anything: on error nothing is written and the Status names the
// argument, the expected and the actual value.
//
// Conventions: T tokens in the step (padding included), R requests,
// W sliding window, r compress ratio (1, 4, 128), K indexer top-k.
// pos of the i-th query token of a request = seq_len - query_len + i.
// -1 is the invalid index / padding slot everywhere. Full field reference with
// a worked example: docs/metadata.md.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// ---------------------------------------------------------------------------
// Layer types and configuration

// Attention layer type by compress ratio (spec 1.2).
enum class LayerType : int { kSwaOnly = 1, kC4A = 4, kC128A = 128 };

// 1 -> SWA-only, 4 -> C4A, 128 -> C128A; any other ratio is an error.
Expected<LayerType> layer_type_for_ratio(int compress_ratio);
std::string_view layer_type_name(LayerType type);  // "swa-only", "c4a", "c128a"

// Step-independent settings, shared by every step of a model instance.
struct StepConfig {
  int window = 128;                            // W: sliding window (tokens)
  std::int64_t max_model_len = 65536;          // longest context a request may reach
  std::int64_t max_num_batched_tokens = 8192;  // most tokens in one step (padding included)
  int index_topk = 512;                        // K: C4A indexer top-k width
  int num_speculative_tokens = 0;              // MTP draft tokens; decode threshold = 1 + this
  int prefill_chunk_size = 4;                  // requests per fixed prefill chunk
  int swa_page_size = 64;                      // tokens per sliding-window cache page
  int logical_block_size = 256;                // tokens per compressed-group logical block
  // C128A: number of compressed entries a row may hold (capture-stable
  // variant, spec 4.3); 0 = the whole row width c128a_width().
  int c128a_active_width = 0;

  int decode_threshold() const { return 1 + num_speculative_tokens; }
};

// Checks every field (positive sizes, block size divisible by 128, ...).
Status validate_step_config(const StepConfig& config);

// Entries a compressed group stores per logical block: 256 / r (64 for r=4, 2 for r=128).
// Precondition: validated config, ratio 4 or 128.
std::int64_t compressed_block_size(const StepConfig& config, int compress_ratio);
// Width of the C128A index rows: roundup(cdiv(max_model_len, 128), 128).
std::int64_t c128a_width(const StepConfig& config);
// Compressed indices per token of a layer type: K (C4A), c128a_width (C128A), 0 (SWA-only).
std::int64_t compressed_topk_width(const StepConfig& config, LayerType type);
// Width of the combined prefill index rows: roundup(compressed_topk_width + W, 128).
std::int64_t combined_index_width(const StepConfig& config, LayerType type);

// ---------------------------------------------------------------------------
// Batch description (host memory)

// One step's batch, ordered decode-first (requests with query_len <= decode
// threshold, then the others). Block tables are i32 with any strides; a table
// holds at least cdiv(seq_len, page) columns for every request.
struct BatchDescription {
  TensorView query_lens;         // [R] i32: tokens of this step per request (>= 0)
  TensorView seq_lens;           // [R] i32: context length including this step (>= query_len)
  std::int64_t num_tokens = -1;  // T: sum(query_lens) plus trailing padding tokens; -1 = no padding
  TensorView token_valid;        // [T] u8, may be absent: 0 marks a padding token (slot -1) inside a
                                 //   request; trailing tokens beyond sum(query_lens) are always padding
  TensorView swa_block_table;    // [R, >= cdiv(seq_len, 64)] i32: sliding-window group, 64-token pages
  TensorView c4_block_table;     // [R, >= cdiv(seq_len / 4, 64)] i32, may be absent: ratio-4 group
  TensorView c128_block_table;   // [R, >= cdiv(seq_len / 128, 2)] i32, may be absent: ratio-128 group
};

// Scalars of a step (spec 3.1).
struct StepCounts {
  std::int64_t num_reqs = 0;
  std::int64_t num_tokens = 0;         // T, padding included
  std::int64_t num_actual_tokens = 0;  // sum(query_lens)
  std::int64_t num_decodes = 0;
  std::int64_t num_prefills = 0;
  std::int64_t num_decode_tokens = 0;  // = query_start_loc[num_decodes]
  std::int64_t num_prefill_tokens = 0;
  std::int64_t max_query_len = 0;
  std::int64_t max_decode_query_len = 0;
  std::int64_t max_prefill_query_len = 0;
  std::int64_t max_seq_len = 0;
};

// Validates the batch against the config (ordering, lengths, table widths,
// block ids >= 0 and small enough for i32 slots) and returns its counts.
Expected<StepCounts> describe_step(const BatchDescription& batch, const StepConfig& config);

// ---------------------------------------------------------------------------
// Step metadata

// Row counts of every output of build_step_metadata (0 = field not produced).
struct StepMetadataSizes {
  StepCounts counts;
  std::int64_t window = 0;                // W: width of swa_indices rows
  std::int64_t c128a_width = 0;           // width of the C128A rows (0 without a ratio-128 table)
  bool has_c4 = false;                    // c4_block_table present
  bool has_c128 = false;                  // c128_block_table present
  std::int64_t query_start_loc_rows = 0;  // R + 1
  std::int64_t token_rows = 0;            // T
  std::int64_t prefill_request_rows = 0;  // num_prefills
  std::int64_t c128a_decode_rows = 0;     // num_decode_tokens (with a ratio-128 table)
  std::int64_t c128a_prefill_rows = 0;    // num_prefill_tokens (with a ratio-128 table)
};
Expected<StepMetadataSizes> step_metadata_sizes(const BatchDescription& batch, const StepConfig& config);

// Caller-owned outputs. Each leading dimension must hold at least the rows
// step_metadata_sizes() reports (more is allowed: rows past it are not
// touched); row widths must match exactly. Views may be strided. Fields of a
// group whose block table is absent must be absent.
struct StepMetadataBuffers {
  TensorView query_start_loc;        // [R+1] i32: cumulative query lengths
  TensorView token_to_req;           // [T] i32: request of each token; -1 for trailing padding
  TensorView positions;              // [T] i64: absolute position; 0 for trailing padding
  TensorView is_valid_token;         // [T] u8: 1 real token, 0 padding
  TensorView swa_slot_mapping;       // [T] i64: SWA cache slot the token writes; -1 for padding
  TensorView swa_indices;            // [T, W] i32: window slots, oldest first, -1 padded. Rows
                                     //   [0, T_dec) are the decode rows, [T_dec, T_dec + T_pre) prefill
  TensorView swa_lens;               // [T] i32: min(pos + 1, W); 0 for padding
  TensorView prefill_gather_lens;    // [P] i32: query_len + min(prefix_len, W - 1)
  TensorView c4_slot_mapping;        // [T] i64: ratio-4 compressed slot written, else -1
  TensorView c128_slot_mapping;      // [T] i64: ratio-128 compressed slot written, else -1
  TensorView c128a_decode_indices;   // [T_dec, C128W] i32: global compressed slots, -1 padded
  TensorView c128a_decode_lens;      // [T_dec] i32: min((pos+1)//128, active width); 0 for padding
  TensorView c128a_prefill_indices;  // [T_pre, C128W] i32: local entries 0..n-1, then -1
};

// Builds every per-step field (spec 3.1-3.3, 4.1, 4.3, 4.8) into `out`.
Expected<StepCounts> build_step_metadata(const BatchDescription& batch, const StepConfig& config,
                                         const StepMetadataBuffers& out);

// Owning convenience: exactly-sized host buffers plus their views.
struct StepMetadata {
  StepMetadataSizes sizes;
  std::vector<std::int32_t> query_start_loc, token_to_req, swa_indices, swa_lens, prefill_gather_lens;
  std::vector<std::int32_t> c128a_decode_indices, c128a_decode_lens, c128a_prefill_indices;
  std::vector<std::int64_t> positions, swa_slot_mapping, c4_slot_mapping, c128_slot_mapping;
  std::vector<std::uint8_t> is_valid_token;

  const StepCounts& counts() const { return sizes.counts; }
  StepMetadataBuffers buffers();  // views of the vectors above (absent where a group is absent)
};
Expected<StepMetadata> make_step_metadata(const BatchDescription& batch, const StepConfig& config);

// ---------------------------------------------------------------------------
// Prefill chunks and workspace (spec 3.6, 4.4, 5.5)

// A group of consecutive prefill requests processed together over one bf16 workspace.
struct PrefillChunk {
  std::int64_t req_begin = 0, req_end = 0;      // request indices in the batch, [begin, end)
  std::int64_t token_begin = 0, token_end = 0;  // token indices in the step, [begin, end)
  std::int64_t compressed_rows = 0;             // N: max seq_len // r over the chunk (0 for SWA-only)
  std::int64_t workspace_rows = 0;              // M: N + max gather_len over the chunk
};

enum class ChunkPolicy {
  kFixed,     // groups of at most config.prefill_chunk_size requests
  kAdaptive,  // spec 3.6: grow while (#reqs) * M <= prefill_chunk_size * (cdiv(max_model_len, r) + W +
              //   max_num_batched_tokens)
};

// Chunks of the step's prefills for a layer of compress ratio r (1, 4 or 128).
Expected<std::vector<PrefillChunk>> prefill_chunk_plan(const BatchDescription& batch, const StepConfig& config,
                                                       int compress_ratio, ChunkPolicy policy);

// Workspace shapes: kv [chunk_reqs, rows, head_dim] bf16, indices [index_rows, index_width] i32,
// lens [index_rows] i32.
struct PrefillWorkspaceShape {
  std::int64_t chunk_reqs = 0;
  std::int64_t compressed_rows = 0;  // N
  std::int64_t rows = 0;             // M
  std::int64_t head_dim = 512;
  std::int64_t index_rows = 0;
  std::int64_t index_width = 0;  // roundup(topk width + W, 128)
};
// Upper bound for any step (warm-up reservation, spec 5.5):
// N = cdiv(max_model_len, r) (0 for r=1), M = N + W - 1 + max_num_batched_tokens,
// index rows = max_num_batched_tokens. r=4, K=2048, 16384/8192 -> (4, 12415, 512), (8192, 2176).
Expected<PrefillWorkspaceShape> static_prefill_workspace(const StepConfig& config, int compress_ratio);
// Exact shape for one chunk (dynamic sizing): N and M of the chunk, index rows = chunk tokens.
Expected<PrefillWorkspaceShape> chunk_prefill_workspace(const StepConfig& config, int compress_ratio,
                                                        const PrefillChunk& chunk);

// Indices of one chunk's tokens into its flattened workspace (spec 4.4):
// request b of the chunk owns rows [b*M, (b+1)*M); row b*M + x for x < N is
// compressed entry x, row b*M + N + y is raw position seq_len - gather_len + y.
// Per token: the first topk_len = min((pos+1)//r, topk width) entries of
// `topk` that are in [0, (pos+1)//r) (left-compacted; others dropped), then
// its window; remaining columns -1; lens = kept entries + min(pos+1, W).
// topk: [chunk tokens, K] i32 local indices for C4A, [chunk tokens, C128W] for
// C128A (e.g. c128a_prefill_indices rows of the chunk), absent for SWA-only.
// out_indices: [>= chunk tokens, combined_index_width] i32; out_lens [>= chunk tokens] i32.
// workspace_rows / compressed_rows: the chunk's M and N (dynamic), or a
// larger static shape.
Status combine_topk_swa_indices(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                                const PrefillChunk& chunk, std::int64_t compressed_rows, std::int64_t workspace_rows,
                                const TensorView& topk, const TensorView& out_indices, const TensorView& out_lens);

// ---------------------------------------------------------------------------
// Index transforms

// C4A (spec 4.2, bounds-hardened): global[t][k] = table[req][l / bs] * bs + l % bs
// for local l >= 0. An entry with a bad request (outside [0, rows)), a negative
// local index, a block column >= the table's columns or a negative block id is
// dropped; surviving entries are compacted to the left, the tail is -1 and
// lens[t] = survivors (0 when is_valid_token[t] == 0).
// local_topk [n, K] i32, token_to_req [n] i32, is_valid_token [n] u8 (may be
// absent: all valid), block_table [R', nb] i32, global_out [>= n, K] i32, lens_out [>= n] i32.
Status c4a_global_topk_indices(const TensorView& local_topk, const TensorView& token_to_req,
                               const TensorView& is_valid_token, const TensorView& block_table, std::int64_t block_size,
                               const TensorView& global_out, const TensorView& lens_out);

// Mixed layout of FlashInfer TRTLLM-gen (spec 4.6): row t = [W window slots | PK compressed slots],
// PK = roundup4(compressed topk width). Window part: the token's window (swa_indices rules).
// Compressed part: C4A converts the first min((pos+1)//4, K) local entries of
// `c4a_local_topk` [T, K] through the ratio-4 table (bounds as in
// c4a_global_topk_indices, compacted); C128A uses entries 0..n-1 through the
// ratio-128 table; SWA-only has none. lens = W + compressed entries kept (the
// window counts in full; the kernel skips -1 inside it); 0 for padding.
// out_indices [>= T, W + PK] i32 (row stride a multiple of 4), out_lens [>= T] i32.
Status mixed_sparse_indices(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                            const TensorView& c4a_local_topk, const TensorView& out_indices,
                            const TensorView& out_lens);

// V3.2 (spec 4.7): out[t][k] = table[req_id[t]][tok / bs] * block_stride_rows + tok % bs,
// -1 when tok < 0, the request or block column is out of range or the block id is
// negative; order preserved. req_indices [n, K] i32, req_id [n] i32, block_table
// [R', nb] i32, out [>= n, K] i32, valid_counts [>= n] i32 (may be absent).
// block_stride_rows <= 0 means block_size.
Status v32_request_to_global_indices(const TensorView& req_indices, const TensorView& req_id,
                                     const TensorView& block_table, std::int64_t block_size,
                                     std::int64_t block_stride_rows, const TensorView& out,
                                     const TensorView& valid_counts);

// ---------------------------------------------------------------------------
// Dequantize-and-gather (spec 4.5)

// For each b: out[b, offset + i] = decoded row of position seq_len_b - g_b + i
// (i < g_b; g_b = gather_lens[b], or seq_lens[b] when gather_lens is absent),
// read through block_table[b] with the cache's page size and page stride.
// Rows of `out` outside those ranges are not touched.
// seq_lens [B] i32, gather_lens [B] i32 or absent, block_table [B, nb] i32,
// out [B, M, head_dim] bf16 (head_dim of the cache format).
Status dequantize_and_gather(const KvCacheView& cache, const TensorView& seq_lens, const TensorView& gather_lens,
                             const TensorView& block_table, std::int64_t offset, const TensorView& out);

// Fills one chunk's workspace: compressed entries 0..seq_len//r - 1 of each
// request at rows [0, N) (skipped for r = 1), then its gather window at rows
// [N, N + gather_len). compressed_cache is ignored for r = 1.
// out [>= chunk requests, >= M, head_dim] bf16.
Status gather_prefill_chunk(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                            const PrefillChunk& chunk, std::int64_t compressed_rows, const KvCacheView& swa_cache,
                            const KvCacheView& compressed_cache, const TensorView& out);

// ---------------------------------------------------------------------------
// On the device: the Context forms
//
// For serving engines that capture a whole step in a CUDA graph. Same structs
// and semantics as the host forms, with every TensorView on the context's CUDA
// device; work is enqueued on context.stream(). A call neither allocates nor
// synchronizes and needs no scratch: the host checks SHAPES, dtypes and
// devices only (a bad one returns a Status naming the argument, and nothing is
// enqueued); VALUES (lengths, request ids, block ids, indices) stay on the
// device and are never read by the host. Where the host form rejects a value,
// the device masks it instead (documented per entry below) and never reads or
// writes out of bounds.
//
// Capacity: shapes are fixed by the caller and stay fixed across graph
// replays. R = batch.query_lens.shape[0] (requests), T = batch.num_tokens
// (tokens, padding included; must be >= 0 on the device: it is the capacity,
// not a value derived from query_lens). Every row of every output up to the
// capacity is written on every call, so a replay with a smaller batch leaves
// nothing stale. Full reference: docs/metadata.md, "On the device".
//
// In a host context (reference, cpu) each Context form is its host form, on
// host tensors, with the host's validation and row rules.

// Entries of the `counts` vector of build_step_metadata(context, ...): the
// StepCounts fields in declaration order (num_reqs, num_tokens,
// num_actual_tokens, num_decodes, num_prefills, num_decode_tokens,
// num_prefill_tokens, max_query_len, max_decode_query_len,
// max_prefill_query_len, max_seq_len), then one error word.
inline constexpr int kStepCountFields = 12;
inline constexpr int kStepErrorWord = 11;

// Bits of the error word: one per rule describe_step() checks on values.
// 0 = the batch satisfies every rule (then every output equals the host
// builder's bytes in the rows the host writes). Host contexts report a broken
// rule as an error Status instead and write nothing.
enum StepError : std::int64_t {
  kStepNegativeQueryLen = 1 << 0,    // a query_lens[r] < 0
  kStepSeqLenBelowQuery = 1 << 1,    // a seq_lens[r] < query_lens[r]
  kStepSeqLenAboveMax = 1 << 2,      // a seq_lens[r] > config.max_model_len
  kStepTooManyTokens = 1 << 3,       // sum(query_lens) > T (the capacity)
  kStepUnordered = 1 << 4,           // a request <= the decode threshold after a prefill
  kStepBadSwaTable = 1 << 5,         // swa_block_table: too few columns, or a read block id
                                     //   < 0 or too large for i32 slots
  kStepBadC4Table = 1 << 6,          // c4_block_table: same
  kStepBadC128Table = 1 << 7,        // c128_block_table: same
};

// build_step_metadata on the context's backend (spec 3.1-3.3, 4.1, 4.3, 4.8),
// the counts written to `counts` (i64 [kStepCountFields] in the context's
// memory; host contexts write the error word 0).
//
// Device shapes (leading dims at least these, row widths exact, any strides):
// query_start_loc [R+1]; token fields [T]; swa_indices [T, W];
// prefill_gather_lens [R]; c128a_decode_indices [T, C128W], c128a_decode_lens
// [T], c128a_prefill_indices [T, C128W] (group fields present iff their block
// table is); counts i64 [kStepCountFields]; token_valid [T] u8 if present;
// block tables [>= R, any] i32.
//
// Device placement equals the host's: rows [0, T_dec) of the C128A decode
// outputs are the decode tokens, rows [0, T_pre) of c128a_prefill_indices the
// prefill tokens, rows [0, P) of prefill_gather_lens the prefills. Rows past
// the real counts get padding: token_to_req -1, positions 0, is_valid_token 0,
// slot mappings -1, index rows all -1, lengths 0, prefill_gather_lens 0.
// counts[1] (num_tokens) is T.
//
// Device, invalid values (error word != 0): everything is still written,
// nothing is read out of bounds, but rows need not match anything: negative
// query_lens count as 0; a token whose position would be negative (seq_len <
// query_len) is written as a padding token of its request; tokens beyond T are
// dropped; requests after an out-of-order one are split as the host would split
// the first prefix (the first query_len > threshold starts the prefills); a
// block column beyond the table or a negative id gives slot -1; a slot above
// 2^31-1 is -1 in the i32 rows (the i64 slot mappings keep it).
Status build_step_metadata(const Context& context, const BatchDescription& batch, const StepConfig& config,
                           const StepMetadataBuffers& out, const TensorView& counts);

// c4a_global_topk_indices on the context's backend. Device: already
// value-driven (bad request, index, column or block id drops the entry).
Status c4a_global_topk_indices(const Context& context, const TensorView& local_topk, const TensorView& token_to_req,
                               const TensorView& is_valid_token, const TensorView& block_table, std::int64_t block_size,
                               const TensorView& global_out, const TensorView& lens_out);

// v32_request_to_global_indices on the context's backend (device:
// value-driven, order preserved).
Status v32_request_to_global_indices(const Context& context, const TensorView& req_indices, const TensorView& req_id,
                                     const TensorView& block_table, std::int64_t block_size,
                                     std::int64_t block_stride_rows, const TensorView& out,
                                     const TensorView& valid_counts);

// mixed_sparse_indices on the context's backend. Device: batch on the device,
// T = batch.num_tokens >= 0 rows are written (rows of tokens beyond
// sum(query_lens) are padding). Value handling as the device
// build_step_metadata: negative query_lens count as 0, a token with a negative
// position or beyond T is padding (row -1, lens 0), table lookups that fail
// drop the compressed entry (compacted) or give -1 in the window part. The
// decode/prefill order is not needed and not checked.
Status mixed_sparse_indices(const Context& context, const BatchDescription& batch, const StepConfig& config,
                            int compress_ratio, const TensorView& c4a_local_topk, const TensorView& out_indices,
                            const TensorView& out_lens);

// dequantize_and_gather on the context's backend. Device: output bytes equal
// the host's, except that a NaN (from a NaN code or scale) may carry another
// sign / payload (the GPU's NaN). Values: g_b is clamped to
// [0, min(seq_len_b, out rows - offset)] (a negative seq_len gathers nothing);
// a row whose block column is beyond the table or whose page is outside
// [0, num_pages) is written as zeros. Rows outside the gathered ranges are not
// touched.
Status dequantize_and_gather(const Context& context, const KvCacheView& cache, const TensorView& seq_lens,
                             const TensorView& gather_lens, const TensorView& block_table, std::int64_t offset,
                             const TensorView& out);

// combine_topk_swa_indices on the context's backend, for one chunk of the host
// plan (prefill_chunk_plan stays on the host). Device: rows
// [0, token_end - token_begin) of out_indices / out_lens are written; row i is
// the i-th token of requests [req_begin, req_end) counted on the device from
// their query_lens. The host checks shapes only (chunk inside [0, R), topk
// [>= chunk tokens, topk width], outputs, 0 <= compressed_rows <=
// workspace_rows, chunk requests * workspace_rows <= 2^31 - 1); values are not
// checked against the chunk: rows no token owns (the chunk's query_lens sum to
// less) and tokens with a negative position get -1 rows and length 0, tokens
// past the rows are dropped, and compressed_rows / workspace_rows too small for
// the values give indices past the request's workspace region (never a memory
// access here; the attention kernels mask indices outside the workspace).
Status combine_topk_swa_indices(const Context& context, const BatchDescription& batch, const StepConfig& config,
                                int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                                std::int64_t workspace_rows, const TensorView& topk, const TensorView& out_indices,
                                const TensorView& out_lens);

// gather_prefill_chunk on the context's backend. Device: compressed entries
// 0..seq_len//r - 1 of each chunk request at rows [0, compressed_rows) (at most
// compressed_rows entries: the gather is clamped so it never reaches the window
// rows), then its gather window (prefill_gather_len from the device query_lens
// / seq_lens) at rows [compressed_rows, ...), clamped to out's rows. Bad pages /
// columns as in dequantize_and_gather (zeros). Rows outside those ranges are
// not touched.
Status gather_prefill_chunk(const Context& context, const BatchDescription& batch, const StepConfig& config,
                            int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                            const KvCacheView& swa_cache, const KvCacheView& compressed_cache, const TensorView& out);

}  // namespace smla
