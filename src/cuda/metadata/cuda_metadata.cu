// Step metadata on the device (cuda_build_step_metadata): two kernels, in
// stream order.
//   1. summarize (one block): query_start_loc by a block scan, the decode /
//      prefill split, the counts, prefill_gather_lens, the value error bits.
//   2. rows: one warp per row j < T writes token j's fields and window row,
//      C128A decode row j (token j) and, for a prefill token, C128A prefill
//      row j - T_dec (rows no token owns get padding); a token finds its
//      request by binary search in query_start_loc. One extra block per
//      request checks the block-table rules of describe_step (error word).
#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/metadata/metadata_device.cuh"
#include "src/cuda/metadata/metadata_params.h"

namespace smla::cuda {
namespace {

constexpr int kSummaryThreads = 1024;
constexpr int kRowWarps = 8;

// counts[] entries (StepCounts declaration order).
enum CountField : int {
  kNumReqs = 0,
  kNumTokens,
  kNumActualTokens,
  kNumDecodes,
  kNumPrefills,
  kNumDecodeTokens,
  kNumPrefillTokens,
  kMaxQueryLen,
  kMaxDecodeQueryLen,
  kMaxPrefillQueryLen,
  kMaxSeqLen,
  kErrorWord,
};

// Bits of the error word (the public smla::StepError values).
constexpr std::int64_t kErrNegativeQuery = 1 << 0;
constexpr std::int64_t kErrSeqBelowQuery = 1 << 1;
constexpr std::int64_t kErrSeqAboveMax = 1 << 2;
constexpr std::int64_t kErrTooManyTokens = 1 << 3;
constexpr std::int64_t kErrUnordered = 1 << 4;
constexpr std::int64_t kErrSwaTable = 1 << 5;
constexpr std::int64_t kErrC4Table = 1 << 6;
constexpr std::int64_t kErrC128Table = 1 << 7;

__global__ void __launch_bounds__(kSummaryThreads) summarize_kernel(const __grid_constant__ StepMetadataParams p) {
  __shared__ std::int64_t scan_scratch[kWarp + 1];
  __shared__ long long first_prefill, max_query, max_seq, max_decode_query, max_prefill_query;
  __shared__ unsigned long long decode_tokens;
  __shared__ int all_errors;
  const DeviceBatch& b = p.batch;
  const std::int64_t reqs = b.num_reqs;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    first_prefill = reqs;
    max_query = max_seq = max_decode_query = max_prefill_query = 0;
    decode_tokens = 0;
    all_errors = 0;
    p.query_start_loc[0] = 0;
  }
  __syncthreads();

  // Pass 1: query_start_loc, the first prefill, value errors, maxima.
  std::int64_t carry = 0;
  int errors = 0;
  long long my_first = reqs, my_max_query = 0, my_max_seq = 0;
  for (std::int64_t base = 0; base < reqs; base += kSummaryThreads) {
    const std::int64_t r = base + tid;
    std::int64_t q = 0, s = 0;
    if (r < reqs) {
      q = load_i32(b.query_lens, b.query_lens_stride, r);
      s = load_i32(b.seq_lens, b.seq_lens_stride, r);
      errors |= q < 0 ? static_cast<int>(kErrNegativeQuery) : 0;
      errors |= s < q ? static_cast<int>(kErrSeqBelowQuery) : 0;
      errors |= s > p.max_model_len ? static_cast<int>(kErrSeqAboveMax) : 0;
      if (q > p.decode_threshold && r < my_first) my_first = r;
      my_max_query = detail::max64(my_max_query, q);
      my_max_seq = detail::max64(my_max_seq, s);
    }
    std::int64_t chunk_total = 0;
    const std::int64_t inclusive = block_inclusive_sum(detail::max64(q, 0), scan_scratch, &chunk_total);
    if (r < reqs) {
      // Monotone even for invalid batches; real values stay far below the clamp.
      p.query_start_loc[(r + 1) * p.stride_query_start_loc] =
          static_cast<std::int32_t>(detail::min64(carry + inclusive, detail::kMaxI32));
    }
    carry += chunk_total;
  }
  atomicMin(&first_prefill, my_first);
  atomicMax(&max_query, my_max_query);
  atomicMax(&max_seq, my_max_seq);
  __syncthreads();

  // Pass 2: with the split known, per-part maxima, decode tokens, order, gather lens.
  const std::int64_t decodes = first_prefill;
  long long my_decode_max = 0, my_prefill_max = 0;
  unsigned long long my_decode_tokens = 0;
  for (std::int64_t r = tid; r < reqs; r += kSummaryThreads) {
    const std::int64_t q = load_i32(b.query_lens, b.query_lens_stride, r);
    const std::int64_t s = load_i32(b.seq_lens, b.seq_lens_stride, r);
    if (r < decodes) {
      my_decode_max = detail::max64(my_decode_max, q);
      my_decode_tokens += static_cast<unsigned long long>(detail::max64(q, 0));
    } else {
      my_prefill_max = detail::max64(my_prefill_max, q);
      errors |= (r > decodes && q <= p.decode_threshold) ? static_cast<int>(kErrUnordered) : 0;
      p.prefill_gather_lens[(r - decodes) * p.stride_prefill_gather_lens] =
          static_cast<std::int32_t>(detail::prefill_gather_len(s, q, p.window));
    }
    if (r >= reqs - decodes) p.prefill_gather_lens[r * p.stride_prefill_gather_lens] = 0;  // rows past P
  }
  atomicMax(&max_decode_query, my_decode_max);
  atomicMax(&max_prefill_query, my_prefill_max);
  atomicAdd(&decode_tokens, my_decode_tokens);
  if (errors != 0) atomicOr(&all_errors, errors);
  __syncthreads();

  if (tid == 0) {
    const std::int64_t actual = carry;
    const auto decode_token_count = static_cast<std::int64_t>(decode_tokens);
    std::int64_t error_word = all_errors;
    if (actual > b.num_tokens) error_word |= kErrTooManyTokens;
    std::int64_t* c = p.counts;
    const std::int64_t s = p.stride_counts;
    c[kNumReqs * s] = reqs;
    c[kNumTokens * s] = b.num_tokens;
    c[kNumActualTokens * s] = actual;
    c[kNumDecodes * s] = decodes;
    c[kNumPrefills * s] = reqs - decodes;
    c[kNumDecodeTokens * s] = decode_token_count;
    c[kNumPrefillTokens * s] = actual - decode_token_count;
    c[kMaxQueryLen * s] = max_query;
    c[kMaxDecodeQueryLen * s] = max_decode_query;
    c[kMaxPrefillQueryLen * s] = max_prefill_query;
    c[kMaxSeqLen * s] = max_seq;
    c[kErrorWord * s] = error_word;
  }
}

// describe_step's table rule for entries [first, end) of one request: enough
// columns, every read block id in [0, max_block]. Returns true on a violation.
__device__ bool table_violation(const DeviceTable& t, std::int64_t req, std::int64_t page, std::int64_t first,
                                std::int64_t end) {
  bool bad = false;
  if (end > first) {
    const std::int64_t needed = detail::cdiv(end, page);
    if (t.cols < needed) bad = true;
    const std::int64_t max_block = (detail::kMaxI32 - (page - 1)) / page;
    const std::int32_t* row = t.data + req * t.row_stride;
    const std::int64_t last = detail::min64(needed, t.cols);
    for (std::int64_t col = first / page + threadIdx.x; col < last; col += blockDim.x) {
      const std::int64_t block = row[col * t.col_stride];
      if (block < 0 || block > max_block) bad = true;
    }
  }
  return __syncthreads_or(bad) != 0;
}

// describe_step's table rules for request r, OR-ed into the error word. All threads of the block call it.
__device__ void check_request_tables(const StepMetadataParams& p, std::int64_t r) {
  const DeviceBatch& b = p.batch;
  const std::int64_t q = load_i32(b.query_lens, b.query_lens_stride, r);
  if (q == 0) return;  // nothing of it is read (uniform per block)
  // Past max_model_len the batch is already in error: bound the work.
  const std::int64_t s = detail::min64(load_i32(b.seq_lens, b.seq_lens_stride, r), p.max_model_len);
  std::int64_t bits = 0;
  const std::int64_t window_first = detail::min64(detail::max64(s - q - p.window + 1, 0), s);
  if (table_violation(b.swa, r, p.swa_page, window_first, s)) bits |= kErrSwaTable;
  if (b.c4.data != nullptr && table_violation(b.c4, r, p.c4_block, 0, s / 4)) bits |= kErrC4Table;
  if (b.c128.data != nullptr && table_violation(b.c128, r, p.c128_block, 0, s / 128)) bits |= kErrC128Table;
  if (threadIdx.x == 0 && bits != 0) {
    atomicOr(reinterpret_cast<unsigned long long*>(p.counts + kErrorWord * p.stride_counts),
             static_cast<unsigned long long>(bits));
  }
}

// One token as the rows kernel sees it.
struct TokenInfo {
  std::int64_t req = -1;  // -1: trailing padding
  std::int64_t pos = 0;
  bool valid = false;
};

// Token u < real_tokens: its request by binary search (the last r with
// query_start_loc[r] <= u among r < R), then its position.
__device__ TokenInfo locate_token(const StepMetadataParams& p, std::int64_t u, std::int64_t real_tokens) {
  TokenInfo info;
  if (u >= real_tokens) return info;
  const DeviceBatch& b = p.batch;
  std::int64_t lo = 0, hi = b.num_reqs;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    if (load_i32(p.query_start_loc, p.stride_query_start_loc, mid) <= u) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const std::int64_t start = load_i32(p.query_start_loc, p.stride_query_start_loc, lo);
  const std::int64_t q = load_i32(b.query_lens, b.query_lens_stride, lo);
  const std::int64_t s = load_i32(b.seq_lens, b.seq_lens_stride, lo);
  info.req = lo;
  info.pos = detail::token_position(s, q, u - start);
  info.valid = info.pos >= 0 && (b.token_valid == nullptr || b.token_valid[u * b.token_valid_stride] != 0);
  return info;
}

// Blocks [0, row_blocks) write rows; block row_blocks + r checks request r's tables.
__global__ void __launch_bounds__(kRowWarps * kWarp) rows_kernel(const __grid_constant__ StepMetadataParams p,
                                                                 std::int64_t row_blocks) {
  if (blockIdx.x >= row_blocks) {
    check_request_tables(p, blockIdx.x - row_blocks);
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  const DeviceBatch& b = p.batch;
  if (j >= b.num_tokens) return;
  const std::int64_t actual = p.counts[kNumActualTokens * p.stride_counts];
  const std::int64_t decode_tokens = p.counts[kNumDecodeTokens * p.stride_counts];
  const std::int64_t prefill_tokens = p.counts[kNumPrefillTokens * p.stride_counts];
  const std::int64_t real_tokens = detail::min64(actual, b.num_tokens);

  const TokenInfo tok = locate_token(p, j, real_tokens);
  const detail::BlockTableRow swa = device_table_row(b.swa, tok.req);
  const detail::BlockTableRow c4 = device_table_row(b.c4, tok.req);
  const detail::BlockTableRow c128 = device_table_row(b.c128, tok.req);
  const detail::PageDivider swa_page(p.swa_page);
  const std::int64_t window_len = tok.valid ? detail::window_len(tok.pos, p.window) : 0;
  if (lane == 0) {
    p.token_to_req[j * p.stride_token_to_req] = static_cast<std::int32_t>(tok.req);
    p.positions[j * p.stride_positions] = tok.req < 0 ? 0 : tok.pos;
    p.is_valid_token[j * p.stride_is_valid_token] = tok.valid ? 1 : 0;
    p.swa_slot_mapping[j * p.stride_swa_slot_mapping] = tok.valid ? device_slot(swa, swa_page, tok.pos) : -1;
    p.swa_lens[j * p.stride_swa_lens] = static_cast<std::int32_t>(window_len);
    if (p.c4_slot_mapping != nullptr) {
      p.c4_slot_mapping[j * p.stride_c4_slot_mapping] =
          tok.valid ? detail::compressed_slot_mapping(c4, 4, p.c4_block, tok.pos) : -1;
    }
    if (p.c128_slot_mapping != nullptr) {
      p.c128_slot_mapping[j * p.stride_c128_slot_mapping] =
          tok.valid ? detail::compressed_slot_mapping(c128, 128, p.c128_block, tok.pos) : -1;
    }
  }
  std::int32_t* window_row = p.swa_indices + j * p.stride_swa_indices_t;
  const std::int64_t window_first = tok.pos - window_len + 1;
  for (std::int64_t c = lane; c < p.window; c += kWarp) {
    const std::int32_t v = c < window_len ? as_index(device_slot(swa, swa_page, window_first + c)) : -1;
    window_row[c * p.stride_swa_indices_c] = v;
  }
  if (p.c128a_decode_indices == nullptr) return;

  // C128A decode row j is token j when j < T_dec.
  const detail::PageDivider c128_page(p.c128_block);
  std::int64_t n = 0;
  if (j < decode_tokens && tok.valid) {
    n = detail::min64(detail::max64(detail::visible_compressed(tok.pos, 128), 0), p.c128_active);
  }
  std::int32_t* decode_row = p.c128a_decode_indices + j * p.stride_c128a_decode_t;
  for (std::int64_t c = lane; c < p.c128_width; c += kWarp) {
    decode_row[c * p.stride_c128a_decode_c] = c < n ? as_index(device_slot(c128, c128_page, c)) : -1;
  }
  if (lane == 0) p.c128a_decode_lens[j * p.stride_c128a_decode_lens] = static_cast<std::int32_t>(n);

  // C128A prefill rows: a prefill token j writes row j - T_dec (local entries, validity ignored as
  // on the host); row j is padding when no token in [0, T) owns it, i.e. j >= min(T_pre, T - T_dec).
  auto write_prefill_row = [&](std::int64_t row, std::int64_t local) {
    std::int32_t* out = p.c128a_prefill_indices + row * p.stride_c128a_prefill_t;
    for (std::int64_t c = lane; c < p.c128_width; c += kWarp) {
      out[c * p.stride_c128a_prefill_c] = c < local ? static_cast<std::int32_t>(c) : -1;
    }
  };
  if (j >= decode_tokens && j - decode_tokens < prefill_tokens) {
    write_prefill_row(j - decode_tokens,
                      detail::min64(detail::max64(detail::visible_compressed(tok.pos, 128), 0), p.c128_active));
  }
  if (j >= prefill_tokens || decode_tokens + j >= b.num_tokens) write_prefill_row(j, 0);
}

}  // namespace

cudaError_t launch_step_metadata(const StepMetadataParams& p, cudaStream_t stream) {
  summarize_kernel<<<1, kSummaryThreads, 0, stream>>>(p);
  const std::int64_t row_blocks = detail::cdiv(p.batch.num_tokens, kRowWarps);
  const std::int64_t blocks = row_blocks + p.batch.num_reqs;
  if (blocks > 0) rows_kernel<<<static_cast<unsigned>(blocks), kRowWarps * kWarp, 0, stream>>>(p, row_blocks);
  return cudaGetLastError();
}

}  // namespace smla::cuda
