// File: cuda_metadata.h
//
// Step metadata and index transforms (smla/metadata.h) on the CUDA backend,
// for serving engines that capture a whole step in a CUDA graph.
//
// Same structs and semantics as the host API, with every TensorView on the
// current CUDA device and a `stream` (a cudaStream_t; nullptr = the legacy
// default stream). A call neither allocates nor synchronizes and needs no
// scratch: the host checks SHAPES, dtypes and devices only (a bad one returns
// a Status naming the argument, and nothing is enqueued); VALUES (lengths,
// request ids, block ids, indices) stay on the device and are never read by
// the host. Where the host API rejects a value, the device masks it instead
// (documented per entry below) and never reads or writes out of bounds.
//
// Capacity: shapes are fixed by the caller and stay fixed across graph
// replays. R = batch.query_lens.shape[0] (requests), T = batch.num_tokens
// (tokens, padding included; must be >= 0 here: it is the capacity, not a
// value derived from query_lens). Every row of every output up to the
// capacity is written on every call, so a replay with a smaller batch leaves
// nothing stale. Full reference: docs/metadata.md, "On the device".
//
// In builds without the CUDA backend every entry returns Unimplemented.
#pragma once

#include <cstdint>

#include "smla/kv_format.h"
#include "smla/metadata.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// Entries of the device `counts` vector: the StepCounts fields in declaration
// order (num_reqs, num_tokens, num_actual_tokens, num_decodes, num_prefills,
// num_decode_tokens, num_prefill_tokens, max_query_len, max_decode_query_len,
// max_prefill_query_len, max_seq_len), then one error word.
inline constexpr int kCudaStepCountFields = 12;
inline constexpr int kCudaStepErrorWord = 11;

// Bits of the error word: one per rule describe_step() checks on values.
// 0 = the batch satisfies every rule (then every output equals the host
// builder's bytes in the rows the host writes).
enum CudaStepError : std::int64_t {
  kCudaStepNegativeQueryLen = 1 << 0,    // a query_lens[r] < 0
  kCudaStepSeqLenBelowQuery = 1 << 1,    // a seq_lens[r] < query_lens[r]
  kCudaStepSeqLenAboveMax = 1 << 2,      // a seq_lens[r] > config.max_model_len
  kCudaStepTooManyTokens = 1 << 3,       // sum(query_lens) > T (the capacity)
  kCudaStepUnordered = 1 << 4,           // a request <= the decode threshold after a prefill
  kCudaStepBadSwaTable = 1 << 5,         // swa_block_table: too few columns, or a read block id
                                         //   < 0 or too large for i32 slots
  kCudaStepBadC4Table = 1 << 6,          // c4_block_table: same
  kCudaStepBadC128Table = 1 << 7,        // c128_block_table: same
};

// The host builder on the device (spec 3.1-3.3, 4.1, 4.3, 4.8).
//
// Shapes (leading dims at least these, row widths exact, any strides):
// query_start_loc [R+1]; token fields [T]; swa_indices [T, W];
// prefill_gather_lens [R]; c128a_decode_indices [T, C128W], c128a_decode_lens
// [T], c128a_prefill_indices [T, C128W] (group fields present iff their block
// table is); counts i64 [kCudaStepCountFields]; token_valid [T] u8 if present;
// block tables [>= R, any] i32.
//
// Placement equals the host's: rows [0, T_dec) of the C128A decode outputs are
// the decode tokens, rows [0, T_pre) of c128a_prefill_indices the prefill
// tokens, rows [0, P) of prefill_gather_lens the prefills. Rows past the real
// counts get padding: token_to_req -1, positions 0, is_valid_token 0, slot
// mappings -1, index rows all -1, lengths 0, prefill_gather_lens 0.
// counts[1] (num_tokens) is T.
//
// Invalid values (error word != 0): everything is still written, nothing is
// read out of bounds, but rows need not match anything: negative query_lens
// count as 0; a token whose position would be negative (seq_len < query_len)
// is written as a padding token of its request; tokens beyond T are dropped;
// requests after an out-of-order one are split as the host would split the
// first prefix (the first query_len > threshold starts the prefills); a block
// column beyond the table or a negative id gives slot -1; a slot above 2^31-1
// is -1 in the i32 rows (the i64 slot mappings keep it).
Status cuda_build_step_metadata(const BatchDescription& batch, const StepConfig& config,
                                const StepMetadataBuffers& out, const TensorView& counts, void* stream);

// c4a_global_topk_indices on the device: already value-driven (bad request,
// index, column or block id drops the entry). Shapes as the host function.
Status cuda_c4a_global_topk_indices(const TensorView& local_topk, const TensorView& token_to_req,
                                    const TensorView& is_valid_token, const TensorView& block_table,
                                    std::int64_t block_size, const TensorView& global_out, const TensorView& lens_out,
                                    void* stream);

// v32_request_to_global_indices on the device (value-driven, order preserved).
Status cuda_v32_request_to_global_indices(const TensorView& req_indices, const TensorView& req_id,
                                          const TensorView& block_table, std::int64_t block_size,
                                          std::int64_t block_stride_rows, const TensorView& out,
                                          const TensorView& valid_counts, void* stream);

// mixed_sparse_indices on the device, batch on the device (T = batch.num_tokens
// >= 0 rows are written: rows of tokens beyond sum(query_lens) are padding).
// Value handling as cuda_build_step_metadata: negative query_lens count as 0,
// a token with a negative position or beyond T is padding (row -1, lens 0),
// table lookups that fail drop the compressed entry (compacted) or give -1 in
// the window part. The decode/prefill order is not needed and not checked.
Status cuda_mixed_sparse_indices(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                                 const TensorView& c4a_local_topk, const TensorView& out_indices,
                                 const TensorView& out_lens, void* stream);

// dequantize_and_gather on the device. cache pages on the device; shapes as
// the host function. Output bytes equal the host's, except that a NaN (from a
// NaN code or scale) may carry another sign / payload (the GPU's NaN).
// Values: g_b is clamped to [0, min(seq_len_b, out rows - offset)] (a negative
// seq_len gathers nothing); a row whose block column is beyond the table or
// whose page is outside [0, num_pages) is written as zeros. Rows outside the
// gathered ranges are not touched.
Status cuda_dequantize_and_gather(const KvCacheView& cache, const TensorView& seq_lens,
                                  const TensorView& gather_lens, const TensorView& block_table, std::int64_t offset,
                                  const TensorView& out, void* stream);

// combine_topk_swa_indices on the device for one chunk of the host plan
// (prefill_chunk_plan stays on the host; the chunk is taken by value). Rows
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
Status cuda_combine_topk_swa_indices(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                                     PrefillChunk chunk, std::int64_t compressed_rows, std::int64_t workspace_rows,
                                     const TensorView& topk, const TensorView& out_indices, const TensorView& out_lens,
                                     void* stream);

// gather_prefill_chunk on the device: compressed entries 0..seq_len//r - 1 of
// each chunk request at rows [0, compressed_rows) (at most compressed_rows
// entries: the gather is clamped so it never reaches the window rows), then its
// gather window (prefill_gather_len from the device query_lens / seq_lens) at
// rows [compressed_rows, ...), clamped to out's rows. Bad pages / columns as in
// cuda_dequantize_and_gather (zeros). Rows outside those ranges are not touched.
Status cuda_gather_prefill_chunk(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                                 PrefillChunk chunk, std::int64_t compressed_rows, const KvCacheView& swa_cache,
                                 const KvCacheView& compressed_cache, const TensorView& out, void* stream);

}  // namespace smla
