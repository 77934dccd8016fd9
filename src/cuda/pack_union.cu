// The packed-MTP prepass: one CTA per token group builds the union of the
// group's keys, in the caller's workspace.
//
// A key is (source, slot): an entry within its token's clamped length with
// 0 <= index < num_slots (others are no keys and are never read). The group's
// entries are numbered in (token, source, column) order. Every key goes into a
// shared-memory hash table (open addressing) that collects the mask of the
// tokens listing it and its first entry; the entry that is first for its key
// emits one union entry, so the union is in order of first occurrence whatever
// the timing. Duplicates inside one token's list are attended as many times as
// they appear: the m-th occurrence of a key in token i's list is matched with
// its m-th occurrence in token j's list, so a key listed c_j times by token j
// gives max_j c_j union entries, entry m attended by the tokens with c_j > m.
// Keys some token lists twice are flagged in the table and take that slower
// path (a scan of the group's lists for the key); distinct lists never do.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "src/cuda/common/func_attributes.h"
#include "src/cuda/pack_union.h"
#include "src/cuda/sm80/sparse_attention_kernel.cuh"

namespace smla::cuda {
namespace {

constexpr int kPackThreads = 512;
constexpr std::uint32_t kEmptyCell = 0xFFFFFFFFu;      // no key: slots are below 2^31 - 1
constexpr std::uint32_t kDuplicateBit = 1u << 31;      // in a cell's mask: some token lists the key twice
static_assert(kMaxPackTokens <= 31, "token bits stay below the duplicate bit");

__host__ __device__ constexpr int next_pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Cells of the hash table for groups of up to `entries` entries (load factor <= 1/2).
__host__ __device__ constexpr int table_cells(int entries) { return next_pow2(2 * (entries > 0 ? entries : 1)); }

struct GroupEntry {
  std::uint32_t key = 0;  // source << 31 | slot
  int token = 0;          // in the group
  int source = 0;
  int column = 0;
  bool valid = false;
};

struct Group {
  const SparseAttentionParams& p;
  const int* segment_start;  // [2 * tokens + 1]: (token, source) segments of the entry numbering
  int first_token;

  __device__ std::int32_t index(int token, int source, int column) const {
    const KvSourceParams& src = p.source[source];
    return src.indices[static_cast<std::int64_t>(first_token + token) * src.stride_indices_t + column];
  }
  __device__ int length(int token, int source) const {
    return segment_start[2 * token + source + 1] - segment_start[2 * token + source];
  }
  __device__ GroupEntry entry(int e) const {
    int segment = 0;
    while (segment_start[segment + 1] <= e) ++segment;
    GroupEntry x;
    x.token = segment / 2;
    x.source = segment % 2;
    x.column = e - segment_start[segment];
    const std::int32_t slot = index(x.token, x.source, x.column);
    x.valid = slot >= 0 && static_cast<std::int64_t>(slot) < p.source[x.source].num_slots;
    x.key = static_cast<std::uint32_t>(x.source) << 31 | static_cast<std::uint32_t>(x.valid ? slot : 0);
    return x;
  }
  // Occurrences of `slot` in the first `columns` entries of (token, source).
  __device__ int count(int token, int source, int columns, std::int32_t slot) const {
    int found = 0;
    for (int c = 0; c < columns; ++c) found += index(token, source, c) == slot ? 1 : 0;
    return found;
  }
};

struct HashTable {
  std::uint32_t* keys;
  std::uint32_t* masks;  // token bits | kDuplicateBit
  int* firsts;           // smallest entry number of the key
  std::uint32_t cell_mask;
  int shift;

  __device__ std::uint32_t home(std::uint32_t key) const { return (key * 2654435761u) >> shift & cell_mask; }
  __device__ std::uint32_t insert(std::uint32_t key) const {
    for (std::uint32_t cell = home(key);; cell = (cell + 1) & cell_mask) {
      const std::uint32_t held = atomicCAS(&keys[cell], kEmptyCell, key);
      if (held == kEmptyCell || held == key) return cell;
    }
  }
  __device__ std::uint32_t find(std::uint32_t key) const {
    std::uint32_t cell = home(key);
    while (keys[cell] != key) cell = (cell + 1) & cell_mask;
    return cell;
  }
};

// Whether entry e emits a union entry, and that entry's token mask.
__device__ bool emits_union_entry(const Group& group, const HashTable& table, int e, std::uint32_t* mask) {
  const GroupEntry x = group.entry(e);
  if (!x.valid) return false;
  const std::uint32_t cell = table.find(x.key);
  const std::uint32_t cell_mask = table.masks[cell];
  if ((cell_mask & kDuplicateBit) == 0) {
    *mask = cell_mask;
    return table.firsts[cell] == e;
  }
  // Occurrence matching: e is occurrence `m` of its key in its token's list; it
  // emits when no earlier token lists the key more than m times.
  const std::int32_t slot = static_cast<std::int32_t>(x.key & 0x7FFFFFFFu);
  const int m = group.count(x.token, x.source, x.column, slot);
  bool first = true;
  *mask = 0;
  for (int token = 0; token < group.p.pack_tokens; ++token) {
    const int listed = token == x.token ? m + 1 : group.count(token, x.source, group.length(token, x.source), slot);
    if (listed > m) {
      *mask |= 1u << token;
      first = first && token >= x.token;
    }
  }
  return first;
}

// Exclusive prefix sum of one value per thread; *total gets the sum.
__device__ int block_exclusive_scan(int value, int* warp_sums, int* total) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int sum = lane < kPackThreads / 32 ? warp_sums[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int other = __shfl_up_sync(0xFFFFFFFFu, sum, offset);
      if (lane >= offset) sum += other;
    }
    if (lane < kPackThreads / 32) warp_sums[lane] = sum;  // inclusive over warps
  }
  __syncthreads();
  *total = warp_sums[kPackThreads / 32 - 1];
  return inclusive - value + (warp > 0 ? warp_sums[warp - 1] : 0);
}

__global__ void __launch_bounds__(kPackThreads) pack_union_kernel(const __grid_constant__ SparseAttentionParams p) {
  extern __shared__ std::uint32_t table_storage[];  // keys, masks, firsts: table_cells(pack_capacity) each
  __shared__ int segment_start[2 * kMaxPackTokens + 1];
  __shared__ int warp_sums[kPackThreads / 32];
  const int group_index = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int tokens = p.pack_tokens;
  const Group group{p, segment_start, group_index * tokens};

  if (tid == 0) {
    int total = 0;
    for (int segment = 0; segment < 2 * tokens; ++segment) {
      segment_start[segment] = total;
      const int source = segment % 2;
      if (source < p.num_sources) total += clamped_length(p.source[source], group.first_token + segment / 2);
    }
    segment_start[2 * tokens] = total;
  }
  __syncthreads();
  const int n = segment_start[2 * tokens];  // <= pack_capacity: lengths are clamped to the widths
  const int cells = table_cells(n);
  const int allocated = table_cells(p.pack_capacity);
  HashTable table{table_storage, table_storage + allocated, reinterpret_cast<int*>(table_storage + 2 * allocated),
                  static_cast<std::uint32_t>(cells - 1), 32 - (__ffs(cells) - 1)};
  if (cells == 1) table.shift = 31;  // (a shift by 32 is undefined); the mask keeps cell 0
  for (int cell = tid; cell < cells; cell += kPackThreads) {
    table.keys[cell] = kEmptyCell;
    table.masks[cell] = 0;
    table.firsts[cell] = INT_MAX;
  }
  __syncthreads();
  for (int e = tid; e < n; e += kPackThreads) {
    const GroupEntry x = group.entry(e);
    if (!x.valid) continue;
    const std::uint32_t cell = table.insert(x.key);
    const std::uint32_t bit = 1u << x.token;
    if (atomicOr(&table.masks[cell], bit) & bit) atomicOr(&table.masks[cell], kDuplicateBit);
    atomicMin(&table.firsts[cell], e);
  }
  __syncthreads();

  // Each thread owns a contiguous range of entry numbers: count, scan, emit in order.
  const int per_thread = (n + kPackThreads - 1) / kPackThreads;
  const int begin = min(tid * per_thread, n);
  const int end = min(begin + per_thread, n);
  int mine = 0;
  std::uint32_t mask = 0;
  for (int e = begin; e < end; ++e) mine += emits_union_entry(group, table, e, &mask) ? 1 : 0;
  int total = 0;
  int offset = block_exclusive_scan(mine, warp_sums, &total);
  uint2* out = reinterpret_cast<uint2*>(p.pack_keys) + static_cast<std::int64_t>(group_index) * p.pack_capacity;
  for (int e = begin; e < end; ++e) {
    if (emits_union_entry(group, table, e, &mask)) out[offset++] = make_uint2(group.entry(e).key, mask);
  }
  if (tid == 0) p.pack_counts[group_index] = total;
}

}  // namespace

std::size_t pack_union_smem_bytes(int capacity) {
  if (capacity <= 0 || capacity > kMaxPackEntries) return 0;
  return static_cast<std::size_t>(table_cells(capacity)) * 3 * sizeof(std::uint32_t);
}

cudaError_t launch_pack_union(const SparseAttentionParams& params, cudaStream_t stream) {
  const int smem = static_cast<int>(pack_union_smem_bytes(params.pack_capacity));
  if (smem == 0 || params.pack_tokens < 2 || params.num_tokens % params.pack_tokens != 0) return cudaErrorInvalidValue;
  const cudaError_t status = ensure_dynamic_smem(pack_union_kernel, smem);
  if (status != cudaSuccess) return status;
  pack_union_kernel<<<params.num_tokens / params.pack_tokens, kPackThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace smla::cuda
