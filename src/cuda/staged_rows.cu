// The staging passes of src/cuda/staged_rows.h. The hash set is open addressing
// over 32-bit keys (source << 31 | slot; slots are below 2^31 - 1, so the
// all-ones word is free to mean "empty"), at most half full when the call fits,
// so a lookup takes about one probe. The hash spreads a step's keys over every L2
// slice: a cell per slot instead (no hashing where the caches' slots fit the set)
// made the mark pass 4x slower on PFD-V4-h64, every token writing the same few
// lines (docs/PERF.md).
// Staging rows are numbered by a warp-aggregated counter: their order varies from
// run to run, which changes where a row is staged, never its bytes or the order a
// token reads its keys.
#include "src/cuda/staged_rows.h"

#include <algorithm>
#include <cstring>

#include "smla/numeric.h"
#include "src/core/kv_rows.h"
#include "src/cuda/common/workspace_align.h"
#include "src/cuda/sm80/sparse_attention_kernel.cuh"

namespace smla::cuda {
namespace {

constexpr std::uint32_t kEmptyKey = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kCounterWords = 4;

std::uint32_t next_pow2(std::uint64_t n) {
  std::uint64_t p = 1;
  while (p < n) p <<= 1;
  return static_cast<std::uint32_t>(p);
}

__device__ __forceinline__ std::uint32_t first_cell(std::uint32_t key, std::uint32_t cells) {
  std::uint32_t h = key * 0x9E3779B1u;
  h ^= h >> 15;
  return h & (cells - 1);
}

__device__ __forceinline__ std::uint32_t key_of(int source, std::int32_t slot) {
  return static_cast<std::uint32_t>(source) << 31 | static_cast<std::uint32_t>(slot);
}

// The slot of entry j of the token's list of `src`, or -1 where the kernel reads nothing.
__device__ __forceinline__ std::int32_t attended_slot(const KvSourceParams& src, int token, int j) {
  const std::int32_t slot = src.indices[static_cast<std::int64_t>(token) * src.stride_indices_t + j];
  return slot >= 0 && slot < src.num_slots ? slot : -1;
}

struct StagingKernelParams {
  SparseAttentionParams direct;
  StagingLayout layout;
  StagingBuffers buffers;
  std::uint32_t pool_rows = 0;  // > 0: the expansion takes every slot of the caches (main's, then extra's)
};

// Entries each thread takes per round, their loads issued together: the passes
// are a chain of dependent loads (index, then cell), so they run on latency.
constexpr int kBatch = 4;

// Set once the call names more distinct keys than the buffer holds: the passes
// stop, and the direct kernel computes the call.
__device__ __forceinline__ bool set_overflowed(const StagingKernelParams& p) {
  return __ldcg(&p.buffers.counters[kTableFull]) != 0;
}

// Probes after which an insert looks at the overflow word: the set is at most half
// full while the call fits, so a key takes about one probe; a set that filled up
// made every later insert probe the whole table (a call that did not fit took 10x
// the direct kernel's time, docs/PERF.md).
constexpr std::uint32_t kProbesBeforeOverflowCheck = 8;

__device__ __forceinline__ void insert_key(const StagingKernelParams& p, std::uint32_t key, std::uint32_t cell,
                                           std::uint32_t seen) {
  const std::uint32_t cells = p.layout.table_cells;
  for (std::uint32_t probe = 0; probe < cells; ++probe) {
    if (seen == kEmptyKey) {
      seen = atomicCAS(&p.buffers.cell_keys[cell], kEmptyKey, key);
      if (seen == kEmptyKey) {
        // The key one past the buffer's rows: the call does not fit.
        if (atomicAdd(&p.buffers.counters[kMarkedKeys], 1u) >= p.layout.capacity_rows) {
          atomicExch(&p.buffers.counters[kTableFull], 1u);
        }
        return;
      }
    }
    if (seen == key) return;
    if (probe >= kProbesBeforeOverflowCheck && set_overflowed(p)) return;
    cell = (cell + 1) & (cells - 1);
    seen = p.buffers.cell_keys[cell];
  }
  atomicExch(&p.buffers.counters[kTableFull], 1u);
}

// Block (token, source): every attended key of the token's list goes into the set.
__global__ void __launch_bounds__(kThreads) mark_keys_kernel(const __grid_constant__ StagingKernelParams p) {
  const int token = static_cast<int>(blockIdx.x);
  const int source = static_cast<int>(blockIdx.y);
  const KvSourceParams& src = key_source(p.direct, source);
  const int n = clamped_length(src, token);
  for (int first = static_cast<int>(threadIdx.x); first < n; first += kThreads * kBatch) {
    std::int32_t slots[kBatch];
    for (int b = 0; b < kBatch; ++b) {
      const int j = first + b * kThreads;
      slots[b] = j < n ? attended_slot(src, token, j) : -1;
    }
    if (set_overflowed(p)) return;  // read beside the indices: one latency for both
    std::uint32_t cells[kBatch];
    std::uint32_t seen[kBatch];
    for (int b = 0; b < kBatch; ++b) {
      cells[b] = first_cell(key_of(source, slots[b]), p.layout.table_cells);
      seen[b] = slots[b] >= 0 ? p.buffers.cell_keys[cells[b]] : kEmptyKey;
    }
    for (int b = 0; b < kBatch; ++b) {
      if (slots[b] >= 0) insert_key(p, key_of(source, slots[b]), cells[b], seen[b]);
    }
  }
}

// Numbers every occupied cell: its key's staging row, and the row's key.
__global__ void __launch_bounds__(kThreads) number_keys_kernel(const __grid_constant__ StagingKernelParams p) {
  if (set_overflowed(p)) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::uint32_t cells = p.layout.table_cells;
  const std::uint32_t stride = gridDim.x * kThreads;
  for (std::uint32_t warp_first = blockIdx.x * kThreads + threadIdx.x - lane; warp_first < cells;
       warp_first += stride) {
    const std::uint32_t cell = warp_first + lane;
    const std::uint32_t key = cell < cells ? p.buffers.cell_keys[cell] : kEmptyKey;
    const bool occupied = key != kEmptyKey;
    const unsigned mask = __ballot_sync(0xFFFFFFFFu, occupied);
    if (mask == 0) continue;
    std::uint32_t first = 0;
    if (lane == 0) first = atomicAdd(&p.buffers.counters[kStagedRows], static_cast<std::uint32_t>(__popc(mask)));
    first = __shfl_sync(0xFFFFFFFFu, first, 0);
    if (!occupied) continue;
    const std::uint32_t row = first + static_cast<std::uint32_t>(__popc(mask & ((1u << lane) - 1u)));
    p.buffers.cell_rows[cell] = row;
    if (row < p.layout.capacity_rows) p.buffers.row_keys[row] = key;
  }
}

__device__ __forceinline__ bool over_capacity(const StagingKernelParams& p) {
  return p.buffers.counters[kStagedRows] > p.layout.capacity_rows || p.buffers.counters[kTableFull] != 0;
}

// A thread per 8 values of a staged row, decoded by the codec's rule (the bf16 the direct kernel expands to).
template <class Format>
__global__ void __launch_bounds__(kThreads) expand_rows_kernel(const __grid_constant__ StagingKernelParams p) {
  const bool whole_pool = p.pool_rows > 0;
  if (!whole_pool && over_capacity(p)) return;
  constexpr int kUnits = Format::kHeadDim / detail::kDecodeUnit;
  const std::uint32_t rows = whole_pool ? p.pool_rows : p.buffers.counters[kStagedRows];
  const std::uint64_t items = static_cast<std::uint64_t>(rows) * kUnits;
  const auto main_slots = static_cast<std::uint32_t>(p.direct.source[0].num_slots);
  for (std::uint64_t item = static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x; item < items;
       item += static_cast<std::uint64_t>(gridDim.x) * kThreads) {
    const std::uint32_t row = static_cast<std::uint32_t>(item / kUnits);
    const int unit = static_cast<int>(item % kUnits);
    std::uint32_t key = 0;
    if (!whole_pool) {
      key = p.buffers.row_keys[row];
    } else {
      key = row < main_slots ? key_of(0, static_cast<std::int32_t>(row))
                             : key_of(1, static_cast<std::int32_t>(row - main_slots));
    }
    const KvSourceParams& src = key_source(p.direct, static_cast<int>(key >> 31));
    const std::int64_t slot = key & 0x7FFFFFFFu;
    const std::int64_t page = slot / src.page_size;
    float values[detail::kDecodeUnit];
    detail::decode_unit<Format>(src.pages + page * src.page_stride_bytes, src.page_size, slot - page * src.page_size,
                                src.fp8_scale, unit, values);
    std::uint16_t bits[detail::kDecodeUnit];
    for (int d = 0; d < detail::kDecodeUnit; ++d) bits[d] = f32_to_bf16(values[d]);
    uint4 packed;
    std::memcpy(&packed, bits, sizeof(packed));
    *reinterpret_cast<uint4*>(p.buffers.rows + static_cast<std::int64_t>(row) * Format::kHeadDim +
                              unit * detail::kDecodeUnit) = packed;
  }
}

// The staging row of `key`, whose first cell `cell` held `seen`.
__device__ __forceinline__ std::int32_t staged_row(const StagingKernelParams& p, std::uint32_t key, std::uint32_t cell,
                                                   std::uint32_t seen) {
  const std::uint32_t cells = p.layout.table_cells;
  for (std::uint32_t probe = 0; probe < cells; ++probe) {
    if (seen == key) return static_cast<std::int32_t>(p.buffers.cell_rows[cell]);
    if (seen == kEmptyKey) break;
    cell = (cell + 1) & (cells - 1);
    seen = p.buffers.cell_keys[cell];
  }
  return -1;  // only when the set filled up, and then the direct kernel runs instead
}

// Block = token: its main then extra entries as one list of staging rows. Block 0 also sets the gate.
__global__ void __launch_bounds__(kThreads) rewrite_indices_kernel(const __grid_constant__ StagingKernelParams p) {
  const int token = static_cast<int>(blockIdx.x);
  const bool overflow = over_capacity(p);
  if (token == 0 && threadIdx.x == 0) p.buffers.counters[kGate] = overflow ? 1u : 0u;
  if (overflow) return;
  const int n_main = clamped_length(p.direct.source[0], token);
  const int n_keys = n_main + (p.direct.num_sources > 1 ? clamped_length(p.direct.source[1], token) : 0);
  if (threadIdx.x == 0) p.buffers.lengths[token] = n_keys;
  std::int32_t* out = p.buffers.indices + static_cast<std::int64_t>(token) * p.layout.width;
  for (int first = static_cast<int>(threadIdx.x); first < n_keys; first += kThreads * kBatch) {
    std::int32_t slots[kBatch];
    for (int b = 0; b < kBatch; ++b) {
      const int j = first + b * kThreads;
      slots[b] = -1;
      if (j < n_main) {
        slots[b] = attended_slot(p.direct.source[0], token, j);
      } else if (j < n_keys) {
        slots[b] = attended_slot(p.direct.source[1], token, j - n_main);
      }
    }
    std::uint32_t keys[kBatch];
    std::uint32_t cells[kBatch];
    std::uint32_t seen[kBatch];
    for (int b = 0; b < kBatch; ++b) {
      keys[b] = key_of(first + b * kThreads < n_main ? 0 : 1, slots[b]);
      cells[b] = first_cell(keys[b], p.layout.table_cells);
      seen[b] = slots[b] >= 0 ? p.buffers.cell_keys[cells[b]] : kEmptyKey;
    }
    std::int32_t rows[kBatch];
    for (int b = 0; b < kBatch; ++b) rows[b] = slots[b] < 0 ? -1 : staged_row(p, keys[b], cells[b], seen[b]);
    for (int b = 0; b < kBatch; ++b) {
      const int j = first + b * kThreads;
      if (j < n_keys) out[j] = rows[b];
    }
  }
}

// Enough blocks to fill the device a few times over; the loops stride over the rest.
constexpr unsigned kMaxBlocks = 2048;

unsigned blocks_for(std::uint64_t items) {
  return static_cast<unsigned>(std::clamp<std::uint64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

cudaError_t launch_expand(KvFormat format, const StagingKernelParams& params, std::uint32_t rows,
                          cudaStream_t stream) {
  const unsigned blocks = blocks_for(std::uint64_t{rows} * (params.layout.head_dim / detail::kDecodeUnit));
  if (format == KvFormat::kV4Fp8) {
    expand_rows_kernel<V4Fp8Format><<<blocks, kThreads, 0, stream>>>(params);
  } else if (format == KvFormat::kV32Fp8) {
    expand_rows_kernel<V32Fp8Format><<<blocks, kThreads, 0, stream>>>(params);
  } else {
    return cudaErrorInvalidValue;  // the plan stages the tiled FP8 formats only
  }
  return cudaGetLastError();
}

std::int64_t slots_of(const SparseAttentionParams& direct, int source) {
  return source < direct.num_sources ? direct.source[source].num_slots : 0;
}

// Every slot of the call's caches: main's, then extra's.
std::int64_t pool_slots(const SparseAttentionParams& direct) { return slots_of(direct, 0) + slots_of(direct, 1); }

// Where each staging buffer starts, from the start of the staging workspace: the one
// list that both the size and the carving read.
struct StagingOffsets {
  std::size_t counters, cell_keys, cell_rows, row_keys, rows, indices, lengths, end;
};

StagingOffsets staging_offsets(const StagingLayout& layout) {
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t start = at;
    at += align_workspace(bytes);
    return start;
  };
  const std::size_t cells = layout.table_cells;
  const std::size_t rows = layout.capacity_rows;
  const auto entries = static_cast<std::size_t>(layout.num_tokens) * static_cast<std::size_t>(layout.width);
  StagingOffsets o{};
  o.counters = take(kCounterWords * sizeof(std::uint32_t));
  o.cell_keys = take(cells * sizeof(std::uint32_t));
  o.cell_rows = take(cells * sizeof(std::uint32_t));
  o.row_keys = take(rows * sizeof(std::uint32_t));
  o.rows = take(rows * static_cast<std::size_t>(layout.head_dim) * sizeof(std::uint16_t));
  o.indices = take(entries * sizeof(std::int32_t));
  o.lengths = take(static_cast<std::size_t>(layout.num_tokens) * sizeof(std::int32_t));
  o.end = at;
  return o;
}

}  // namespace

std::size_t StagingLayout::bytes() const { return staging_offsets(*this).end; }

StagingLayout staging_layout(std::int64_t num_tokens, int width, int head_dim, std::int64_t max_rows) {
  StagingLayout layout;
  layout.num_tokens = num_tokens;
  layout.width = width;
  layout.head_dim = head_dim;
  // Slots are int32, so no call names more than 2^31 rows; the set keeps twice that in cells.
  const std::int64_t rows = std::clamp<std::int64_t>(std::min(num_tokens * width, max_rows), 1, std::int64_t{1} << 30);
  layout.capacity_rows = static_cast<std::uint32_t>(rows);
  layout.table_cells = next_pow2(2 * static_cast<std::uint64_t>(rows));
  return layout;
}

StagingBuffers staging_buffers(const StagingLayout& layout, void* workspace) {
  auto* base = static_cast<std::uint8_t*>(workspace);
  const StagingOffsets o = staging_offsets(layout);
  StagingBuffers b;
  b.counters = reinterpret_cast<std::uint32_t*>(base + o.counters);
  b.cell_keys = reinterpret_cast<std::uint32_t*>(base + o.cell_keys);
  b.cell_rows = reinterpret_cast<std::uint32_t*>(base + o.cell_rows);
  b.row_keys = reinterpret_cast<std::uint32_t*>(base + o.row_keys);
  b.rows = reinterpret_cast<std::uint16_t*>(base + o.rows);
  b.indices = reinterpret_cast<std::int32_t*>(base + o.indices);
  b.lengths = reinterpret_cast<std::int32_t*>(base + o.lengths);
  return b;
}

cudaError_t launch_row_staging(KvFormat format, const SparseAttentionParams& direct, const StagingLayout& layout,
                               const StagingBuffers& buffers, cudaStream_t stream) {
  if (direct.num_tokens == 0) return cudaSuccess;
  const StagingKernelParams params{direct, layout, buffers};
  cudaError_t error = cudaMemsetAsync(buffers.counters, 0, kCounterWords * sizeof(std::uint32_t), stream);
  if (error == cudaSuccess) {
    error = cudaMemsetAsync(buffers.cell_keys, 0xFF, std::size_t{layout.table_cells} * sizeof(std::uint32_t), stream);
  }
  if (error != cudaSuccess) return error;
  const dim3 per_token_source(static_cast<unsigned>(direct.num_tokens), static_cast<unsigned>(direct.num_sources));
  mark_keys_kernel<<<per_token_source, kThreads, 0, stream>>>(params);
  number_keys_kernel<<<blocks_for(layout.table_cells), kThreads, 0, stream>>>(params);
  error = launch_expand(format, params, layout.capacity_rows, stream);
  if (error != cudaSuccess) return error;
  rewrite_indices_kernel<<<static_cast<unsigned>(direct.num_tokens), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

bool pool_fits(const SparseAttentionParams& direct, const StagingLayout& layout) {
  return pool_slots(direct) <= layout.capacity_rows;
}

bool whole_pool_pays(const SparseAttentionParams& direct, const StagingLayout& layout) {
  // The named-rows passes cost about as much per 41 index entries as the expansion
  // per row (ncu, PFD-V32-h128 131K: 240 us for 8.4 M entries, 153 us for 131 K rows;
  // docs/PERF.md); 32 leans towards the one pass.
  constexpr std::int64_t kEntriesPerRow = 32;
  return pool_fits(direct, layout) && pool_slots(direct) * kEntriesPerRow <= layout.num_tokens * layout.width;
}

cudaError_t launch_pool_staging(KvFormat format, const SparseAttentionParams& direct, const StagingLayout& layout,
                                const StagingBuffers& buffers, cudaStream_t stream) {
  StagingKernelParams params{direct, layout, buffers};
  params.pool_rows = static_cast<std::uint32_t>(pool_slots(direct));
  if (params.pool_rows == 0) return cudaSuccess;
  return launch_expand(format, params, params.pool_rows, stream);
}

KvSourceParams pool_source(const SparseAttentionParams& direct, int source, const StagingLayout& layout,
                           const StagingBuffers& buffers) {
  KvSourceParams src = direct.source[source];
  const std::int64_t row_bytes = static_cast<std::int64_t>(layout.head_dim) * sizeof(std::uint16_t);
  src.pages = reinterpret_cast<const std::uint8_t*>(buffers.rows) + (source == 0 ? 0 : slots_of(direct, 0)) * row_bytes;
  src.page_stride_bytes = 0;
  src.row_stride_bytes = row_bytes;
  src.page_size = std::max<std::int64_t>(src.num_slots, 1);  // one page holds every slot
  src.fp8_scale = 1.0f;
  return src;
}

KvSourceParams staged_source(const StagingLayout& layout, const StagingBuffers& buffers) {
  KvSourceParams src;
  src.pages = reinterpret_cast<const std::uint8_t*>(buffers.rows);
  src.row_stride_bytes = static_cast<std::int64_t>(layout.head_dim) * sizeof(std::uint16_t);
  src.page_size = layout.capacity_rows;  // one page holds every row, as in the flat prefill workspace
  src.num_slots = layout.capacity_rows;
  src.indices = buffers.indices;
  src.stride_indices_t = layout.width;
  src.topk = layout.width;
  src.lengths = buffers.lengths;
  src.stride_lengths_t = 1;
  return src;
}

}  // namespace smla::cuda
