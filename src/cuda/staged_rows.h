// Internal: FP8 rows of a prefill-sized call expanded once into bf16, so that
// the copying kernel (the flat prefill workspace's) reads them instead of every
// CTA expanding every key it reads (docs/cuda_sm90.md, "Staged FP8 rows").
//
// Four passes on the stream, no host synchronization:
//   mark     every attended (source, slot) of every token goes into a hash set;
//   number   each distinct key gets a row of the staging buffer;
//   expand   each numbered key's row is decoded (the codec's decode_unit, so the
//            bf16 values are the direct kernel's) into its staging row;
//   rewrite  each token's two index lists become one list of staging rows
//            (main, then extra, as the direct kernel reads them; -1 where the
//            direct kernel reads nothing), with its length.
// The buffer holds capacity_rows rows, fixed at plan time. A call naming more
// distinct rows sets the gate word to 1: the copying kernel then does nothing and
// the direct kernel, launched behind it with the opposite gate, computes the call.
//
// When the caches hold no more slots than the buffer has rows (known from their
// shapes at launch) and few against the call's index entries, the whole pool is
// expanded instead, slot for slot, and the copying kernel reads it through the
// call's own index lists: one pass, no set, no rewrite, no gate, as a FlashMLA
// user's dequantize-and-gather of the whole cache.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "smla/kv_format.h"
#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

struct StagingLayout {
  std::int64_t num_tokens = 0;
  int width = 0;                     // main + extra index width: the rewritten lists' width
  int head_dim = 0;                  // d_qk of the staged bf16 rows
  std::uint32_t capacity_rows = 0;   // distinct rows one call may stage
  std::uint32_t table_cells = 0;     // hash set cells, a power of two >= 2 * capacity_rows

  std::size_t bytes() const;         // workspace the buffers below take
};

// The layout for a call of num_tokens tokens x width keys of head_dim values:
// as many rows as the call can name (num_tokens * width), at most max_rows.
StagingLayout staging_layout(std::int64_t num_tokens, int width, int head_dim, std::int64_t max_rows);

// The staging buffers, carved from `workspace` (layout.bytes() long, 256-byte aligned).
struct StagingBuffers {
  std::uint32_t* cell_keys = nullptr;   // [table_cells]: source << 31 | slot, or empty
  std::uint32_t* cell_rows = nullptr;   // [table_cells]: the key's staging row
  std::uint32_t* row_keys = nullptr;    // [capacity_rows]: the key of each staging row
  std::uint32_t* counters = nullptr;    // kStagedRows, kTableFull, kGate, kMarkedKeys
  std::uint16_t* rows = nullptr;        // [capacity_rows, head_dim] bf16 bits
  std::int32_t* indices = nullptr;      // [num_tokens, width] staging rows, -1 where nothing is read
  std::int32_t* lengths = nullptr;      // [num_tokens]
};
StagingBuffers staging_buffers(const StagingLayout& layout, void* workspace);

inline constexpr int kStagedRows = 0;  // counters[]: distinct keys numbered (may exceed capacity_rows)
inline constexpr int kTableFull = 1;   // 1 once the set holds more keys than capacity_rows (or one found no cell)
inline constexpr int kGate = 2;        // 0: staged, the copying kernel runs; 1: over capacity, the direct one
inline constexpr int kMarkedKeys = 3;  // keys the mark pass inserted

// Enqueues the four passes for the keys of `direct` (the call's params, paged
// FP8 sources of `format`, a tiled format: V4 or V3.2).
cudaError_t launch_row_staging(KvFormat format, const SparseAttentionParams& direct, const StagingLayout& layout,
                               const StagingBuffers& buffers, cudaStream_t stream);

// The call's one source once staged: buffers.rows as flat rows, read through buffers.indices.
KvSourceParams staged_source(const StagingLayout& layout, const StagingBuffers& buffers);

// Whether every slot of `direct`'s caches fits the buffer (then no call overflows it).
bool pool_fits(const SparseAttentionParams& direct, const StagingLayout& layout);
// Whether to expand the whole pool rather than the named rows: it fits, and its
// slots are few against the call's index entries (the named-rows passes read them twice).
bool whole_pool_pays(const SparseAttentionParams& direct, const StagingLayout& layout);
// Enqueues the whole-pool expansion: main's slots, then extra's, into buffers.rows.
cudaError_t launch_pool_staging(KvFormat format, const SparseAttentionParams& direct, const StagingLayout& layout,
                                const StagingBuffers& buffers, cudaStream_t stream);
// Source `source` of `direct` once its pool is staged: its rows in buffers.rows, its own indices and lengths.
KvSourceParams pool_source(const SparseAttentionParams& direct, int source, const StagingLayout& layout,
                           const StagingBuffers& buffers);

}  // namespace smla::cuda
