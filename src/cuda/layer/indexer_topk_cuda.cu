// The cuda row of indexer_topk (smla/indexer.h): the lightning indexer's logits and
// top-k selection on the device, same rows as the host op (smla/indexer.h).
//
// Two launches, no host synchronization:
//  1. logits: one block per (token, tile of 64 entries); keys decoded to f32
//     exactly as the host does (e4m3 * scale, so non-finite scales behave the
//     same), q . k on CUDA cores with f32 accumulation (register tiles of
//     2 heads x 4 entries per thread), heads summed in a fixed order.
//     Each logit is stored as an order-preserving 32-bit key (larger logit =
//     larger key, -0 == +0, NaN = 1 below every number, 0 = not selectable) in
//     the workspace row [T, capacity], capacity = block_table columns * page size.
//  2. select: one block per token; radix select (4 passes of 8 bits) finds the
//     k-th largest key, then one ordered pass keeps every larger key plus the
//     first ties in entry order (equal logits prefer the smaller entry) and
//     compacts the selected entries in ascending order with block scans.
// A token with (pos + 1) / 4 <= k entries gets the short-context fill without
// reading anything. Entries whose request row or page is out of range are never
// read and never selected (their rows end with -1 padding instead).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "smla/numeric.h"
#include "src/cuda/common/current_device.h"
#include "src/cuda/common/workspace_align.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {
namespace {


constexpr int kDim = kIndexerHeadDim;  // 128
constexpr int kEntryTile = 64;         // entries per logit block
constexpr int kHeadChunk = 32;         // query heads held in shared memory at once
constexpr int kLogitThreads = 256;
// Register tile per thread: 2 heads (lane % 16 and lane % 16 + 16) x 4 entries (group + 16 m).
constexpr int kHeadLanes = 16;
constexpr int kHeadsPerThread = kHeadChunk / kHeadLanes;            // 2
constexpr int kEntryGroups = kLogitThreads / kHeadLanes;            // 16
constexpr int kEntriesPerThread = kEntryTile / kEntryGroups;        // 4
constexpr int kCodesPerThread = kEntryTile * kDim / kLogitThreads;  // 32 key bytes
constexpr int kQueryRow = kDim + 4;  // padding: 8 lanes reading float4s of 8 heads hit distinct banks
constexpr std::size_t kLogitSharedBytes = (kHeadChunk * kQueryRow + kEntryTile * kDim) * sizeof(float);
constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kRadixBins = 256;
constexpr std::uint32_t kUnselectable = 0;
constexpr std::uint32_t kNanKey = 1;
static_assert(kCodesPerThread % 16 == 0 && kEntryTile * (kDim / kCodesPerThread) == kLogitThreads);
static_assert(kHeadsPerThread == 2 && kEntriesPerThread == 4);

struct TopkParams {
  const std::uint8_t* q = nullptr;  // e4m3 [T, H, 128]
  std::int64_t stride_q_t = 0, stride_q_h = 0;
  const float* head_weights = nullptr;
  std::int64_t stride_w_t = 0, stride_w_h = 0;
  int heads = 0;
  const void* positions = nullptr;
  bool positions_i64 = false;
  std::int64_t stride_positions = 0;
  const void* token_to_request = nullptr;
  bool requests_i64 = false;
  std::int64_t stride_requests = 0;
  const std::int32_t* block_table = nullptr;
  std::int64_t stride_table_r = 0, stride_table_c = 0, table_rows = 0;
  const std::uint8_t* pages = nullptr;
  std::int64_t page_stride = 0, page_size = 1, num_pages = 0;
  bool pages_aligned_16 = false;
  std::int64_t tokens = 0;
  int top_k = 0;
  std::int64_t capacity = 0;      // entries addressable through one block-table row
  std::uint32_t* keys = nullptr;  // workspace [T, capacity]
  std::int32_t* topk = nullptr;
  std::int64_t stride_topk_t = 0;
};

__device__ std::int64_t load_index(const void* base, bool is_i64, std::int64_t offset) {
  return is_i64 ? static_cast<const std::int64_t*>(base)[offset] : static_cast<const std::int32_t*>(base)[offset];
}

// (pos + 1) / 4 without overflow; a negative position (padding) has no entries.
__device__ std::int64_t token_entries(const TopkParams& p, std::int64_t t) {
  const std::int64_t pos = load_index(p.positions, p.positions_i64, t * p.stride_positions);
  if (pos < 0) return 0;
  return pos / kIndexerRatio + (pos % kIndexerRatio == kIndexerRatio - 1 ? 1 : 0);
}

// Larger logit -> larger key; -0 and +0 tie; NaN ranks below every number.
__device__ std::uint32_t order_key(float logit) {
  if (isnan(logit)) return kNanKey;
  if (logit == 0.0f) logit = 0.0f;
  const std::uint32_t u = f32_bits(logit);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // -inf -> 0x007FFFFF > kNanKey
}

__global__ void __launch_bounds__(kLogitThreads) indexer_logits_kernel(const TopkParams p) {
  // Dynamic shared memory (kLogitSharedBytes): query [kHeadChunk][kQueryRow] then keys [kEntryTile][kDim].
  extern __shared__ float4 shared_storage[];
  float* query = reinterpret_cast<float*>(shared_storage);
  float* keys = query + kHeadChunk * kQueryRow;
  __shared__ float weights[kHeadChunk];
  __shared__ bool readable[kEntryTile];
  const int tid = static_cast<int>(threadIdx.x);
  const int head_lane = tid % kHeadLanes;
  const int group = tid / kHeadLanes;
  const std::int64_t tile_first = static_cast<std::int64_t>(blockIdx.x) * kEntryTile;

  for (std::int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const std::int64_t entries = token_entries(p, t);
    if (entries <= p.top_k) continue;  // short-context fill: the select kernel needs no logits
    const std::int64_t n = entries < p.capacity ? entries : p.capacity;
    if (tile_first >= n) continue;
    __syncthreads();  // the previous token's readers of the shared arrays are done

    // Decode 32 key bytes per thread: entry tile_first + tid / 4, dims (tid % 4) * 32 + [0, 32).
    {
      const int row = tid / (kDim / kCodesPerThread);
      const int first_dim = (tid % (kDim / kCodesPerThread)) * kCodesPerThread;
      const std::int64_t j = tile_first + row;
      const std::int64_t request = load_index(p.token_to_request, p.requests_i64, t * p.stride_requests);
      const std::uint8_t* page = nullptr;
      std::int64_t entry = 0;
      if (j < n && request >= 0 && request < p.table_rows) {
        const std::int64_t block = p.block_table[request * p.stride_table_r + (j / p.page_size) * p.stride_table_c];
        if (block >= 0 && block < p.num_pages) {
          page = p.pages + block * p.page_stride;
          entry = j % p.page_size;
        }
      }
      if (first_dim == 0) readable[row] = page != nullptr;
      float* key_row = keys + row * kDim + first_dim;
      if (page != nullptr) {
        const std::uint8_t* scale_bytes = page + IndexerFp8Format::scale_offset(entry, p.page_size);
        const float scale = f32_from_bits(
            static_cast<std::uint32_t>(scale_bytes[0]) | (static_cast<std::uint32_t>(scale_bytes[1]) << 8) |
            (static_cast<std::uint32_t>(scale_bytes[2]) << 16) | (static_cast<std::uint32_t>(scale_bytes[3]) << 24));
        const std::uint8_t* codes = page + IndexerFp8Format::data_offset(entry, p.page_size) + first_dim;
        for (int c = 0; c < kCodesPerThread; c += 16) {
          std::uint8_t bytes[16];
          if (p.pages_aligned_16) {
            const uint4 chunk = *reinterpret_cast<const uint4*>(codes + c);
            memcpy(bytes, &chunk, sizeof bytes);
          } else {
            for (int i = 0; i < 16; ++i) bytes[i] = codes[c + i];
          }
          // Exactly the host decode: e4m3 * scale in f32 (non-finite scales behave the same).
          for (int i = 0; i < 16; i += 4) {
            *reinterpret_cast<float4*>(key_row + c + i) =
                make_float4(__fmul_rn(e4m3_to_f32(bytes[i]), scale), __fmul_rn(e4m3_to_f32(bytes[i + 1]), scale),
                            __fmul_rn(e4m3_to_f32(bytes[i + 2]), scale), __fmul_rn(e4m3_to_f32(bytes[i + 3]), scale));
          }
        }
      } else {
        for (int i = 0; i < kCodesPerThread; i += 4) *reinterpret_cast<float4*>(key_row + i) = make_float4(0, 0, 0, 0);
      }
    }

    float logit[kEntriesPerThread] = {};  // entries group + 16 m, kept by the head_lane == 0 threads
    for (int h0 = 0; h0 < p.heads; h0 += kHeadChunk) {
      const int chunk = p.heads - h0 < kHeadChunk ? p.heads - h0 : kHeadChunk;
      __syncthreads();  // keys stored; the previous chunk's readers of query are done
      for (int idx = tid; idx < kHeadChunk * kDim; idx += kLogitThreads) {
        const int h = idx / kDim, i = idx % kDim;
        query[h * kQueryRow + i] = h < chunk ? e4m3_to_f32(p.q[t * p.stride_q_t + (h0 + h) * p.stride_q_h + i]) : 0.0f;
      }
      if (tid < chunk) weights[tid] = p.head_weights[t * p.stride_w_t + (h0 + tid) * p.stride_w_h];
      __syncthreads();
      float dot[kHeadsPerThread][kEntriesPerThread] = {};
      const float* q0 = query + head_lane * kQueryRow;
      const float* q1 = query + (head_lane + kHeadLanes) * kQueryRow;
#pragma unroll 4
      for (int i = 0; i < kDim; i += 4) {
        const float4 qa = *reinterpret_cast<const float4*>(q0 + i);
        const float4 qb = *reinterpret_cast<const float4*>(q1 + i);
#pragma unroll
        for (int m = 0; m < kEntriesPerThread; ++m) {
          const float4 k = *reinterpret_cast<const float4*>(keys + (group + m * kEntryGroups) * kDim + i);
          dot[0][m] = fmaf(qa.w, k.w, fmaf(qa.z, k.z, fmaf(qa.y, k.y, fmaf(qa.x, k.x, dot[0][m]))));
          dot[1][m] = fmaf(qb.w, k.w, fmaf(qb.z, k.z, fmaf(qb.y, k.y, fmaf(qb.x, k.x, dot[1][m]))));
        }
      }
      // Weighted ReLU (NaN dot -> 0, like the host ops), heads of the chunk summed over the 16 head lanes
      // in a fixed butterfly order; heads past the chunk add nothing (not even 0 * NaN).
#pragma unroll
      for (int m = 0; m < kEntriesPerThread; ++m) {
        float partial = 0.0f;
#pragma unroll
        for (int a = 0; a < kHeadsPerThread; ++a) {
          const int h = head_lane + a * kHeadLanes;
          if (h < chunk) partial = fmaf(weights[h], dot[a][m] > 0.0f ? dot[a][m] : 0.0f, partial);
        }
        for (int offset = kHeadLanes / 2; offset > 0; offset /= 2)
          partial += __shfl_xor_sync(0xFFFFFFFFu, partial, offset);
        logit[m] += partial;
      }
    }
    if (head_lane == 0) {
      for (int m = 0; m < kEntriesPerThread; ++m) {
        const int row = group + m * kEntryGroups;
        if (tile_first + row < n) {
          p.keys[t * p.capacity + tile_first + row] = readable[row] ? order_key(logit[m]) : kUnselectable;
        }
      }
    }
  }
}

// Exclusive count of set flags over the block in thread order; *total gets the block's count.
// Every thread of the block must call it.
__device__ std::uint32_t block_exclusive_count(bool flag, std::uint32_t* total, std::uint32_t* warp_counts) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, flag);
  const std::uint32_t in_warp = static_cast<std::uint32_t>(__popc(ballot & ((1u << lane) - 1u)));
  __syncthreads();  // earlier readers of warp_counts are done
  if (lane == 0) warp_counts[warp] = static_cast<std::uint32_t>(__popc(ballot));
  __syncthreads();
  std::uint32_t before = 0, sum = 0;
  for (unsigned w = 0; w < kSelectWarps; ++w) {
    const std::uint32_t count = warp_counts[w];
    before += w < warp ? count : 0;
    sum += count;
  }
  *total = sum;
  return before + in_warp;
}

__global__ void __launch_bounds__(kSelectThreads) indexer_select_kernel(const TopkParams p) {
  __shared__ std::uint32_t histogram[kRadixBins];
  __shared__ std::uint32_t warp_counts[kSelectWarps];
  __shared__ std::uint32_t chosen_prefix, chosen_remaining;
  const int tid = static_cast<int>(threadIdx.x);

  for (std::int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    std::int32_t* out = p.topk + t * p.stride_topk_t;
    const std::int64_t entries = token_entries(p, t);
    if (entries <= p.top_k) {
      for (int j = tid; j < p.top_k; j += kSelectThreads) out[j] = j < entries ? j : -1;
      continue;
    }
    const std::int64_t n = entries < p.capacity ? entries : p.capacity;
    const std::uint32_t* keys = p.keys + t * p.capacity;

    // Threshold = the k-th largest key; take_ties = how many entries equal to it are selected.
    std::uint32_t threshold = 0;
    std::int64_t take_ties = n;  // n <= k: every readable entry
    if (n > p.top_k) {
      std::uint32_t prefix = 0, mask = 0, remaining = static_cast<std::uint32_t>(p.top_k);
      for (int shift = 24; shift >= 0; shift -= 8) {
        __syncthreads();  // the previous pass (or token) is done with the histogram
        for (int b = tid; b < kRadixBins; b += kSelectThreads) histogram[b] = 0;
        __syncthreads();
        // Logits of one token share their top bits, so most lanes hit one bin: lanes with equal bins
        // combine first (one shared atomic per distinct bin and warp instead of 32 serialized ones).
        for (std::int64_t first = 0; first < n; first += kSelectThreads) {
          const std::int64_t j = first + tid;
          const std::uint32_t key = j < n ? keys[j] : 0u;
          const bool counted = j < n && (key & mask) == prefix;
          const std::uint32_t bin = counted ? (key >> shift) & 0xFFu : kRadixBins;  // kRadixBins: not counted
          const unsigned peers = __match_any_sync(0xFFFFFFFFu, bin);
          if (counted && (threadIdx.x % 32) == static_cast<unsigned>(__ffs(peers) - 1)) {
            atomicAdd(&histogram[bin], static_cast<std::uint32_t>(__popc(peers)));
          }
        }
        __syncthreads();
        if (tid == 0) {
          std::uint32_t above = 0;
          int bin = kRadixBins - 1;
          for (; bin > 0; --bin) {
            if (above + histogram[bin] >= remaining) break;
            above += histogram[bin];
          }
          chosen_prefix = prefix | (static_cast<std::uint32_t>(bin) << shift);
          chosen_remaining = remaining - above;
        }
        __syncthreads();
        prefix = chosen_prefix;
        remaining = chosen_remaining;
        mask |= 0xFFu << shift;
      }
      threshold = prefix;
      take_ties = remaining;
    }

    // Ordered pass: larger keys, then the first take_ties equal keys; compacted in entry order.
    std::int64_t written = 0, ties_seen = 0;
    for (std::int64_t first = 0; first < n; first += kSelectThreads) {
      const std::int64_t j = first + tid;
      const std::uint32_t key = j < n ? keys[j] : kUnselectable;
      const bool tie = j < n && key == threshold;
      std::uint32_t tie_total = 0, selected_total = 0;
      const std::uint32_t tie_rank = block_exclusive_count(tie, &tie_total, warp_counts);
      const bool selected =
          j < n && key != kUnselectable && (key > threshold || (tie && ties_seen + tie_rank < take_ties));
      const std::uint32_t slot = block_exclusive_count(selected, &selected_total, warp_counts);
      if (selected) out[written + slot] = static_cast<std::int32_t>(j);
      written += selected_total;
      ties_seen += tie_total;
      if (written >= p.top_k) break;  // uniform: every later entry would be past the k-th
    }
    for (std::int64_t j = written + tid; j < p.top_k; j += kSelectThreads) out[j] = -1;
  }
}

std::size_t workspace_bytes_for(std::int64_t tokens, std::int64_t capacity) {
  const std::size_t bytes = static_cast<std::size_t>(tokens * capacity) * sizeof(std::uint32_t);
  return cuda::align_workspace(bytes);
}

// fmt does not build in nvcc's host pass: messages are put together here ("{}" = next argument).
std::string to_text(const char* text) { return text; }
template <class Integer>
  requires std::is_integral_v<Integer>
std::string to_text(Integer value) {
  return std::to_string(value);
}

template <class... Args>
std::string runtime_format(std::string_view format, const Args&... args) {
  const std::string texts[] = {std::string(), to_text(args)...};
  std::string result;
  std::size_t next = 1;
  for (std::size_t i = 0; i < format.size(); ++i) {
    if (format.substr(i, 2) == "{}" && next < sizeof...(Args) + 1) {
      result += texts[next++];
      ++i;
    } else {
      result += format[i];
    }
  }
  return result;
}

using layer_cuda::IndexerTopkShape;

// The device-only limits (the front end checked shapes, dtypes and devices):
// i32 head, column and entry counts, every tensor on q_fp8's device, the current one.
Status check_launch(const Context& context, const IndexerTopkArgs& args, const IndexerTopkShape& shape) {
  if (shape.heads > INT32_MAX) return invalid_argument("q_fp8", "at most 2^31-1 heads", args.q_fp8.shape_string());
  if (shape.top_k > INT32_MAX) {
    return invalid_argument("topk_indices", "k in [1, 2^31-1] columns", args.topk_indices.shape_string());
  }
  if (shape.capacity > INT32_MAX) {
    return invalid_argument("block_table", "columns * key page size <= 2^31-1 (i32 entry numbers)",
                            runtime_format("{} x {}", args.block_table.shape[1], args.key_cache.page_size()));
  }
  const int device = args.q_fp8.device.index;
  for (const auto& [view, name] :
       {std::pair{&args.head_weights, "head_weights"}, std::pair{&args.positions, "positions"},
        std::pair{&args.token_to_request, "token_to_request"}, std::pair{&args.block_table, "block_table"},
        std::pair{&args.key_cache.pages, "key_cache"}, std::pair{&args.topk_indices, "topk_indices"}}) {
    if (view->device.index != device) {
      return invalid_argument(name, runtime_format("a tensor on cuda:{} (the device of q_fp8)", device),
                              view->describe());
    }
  }
  return ::smla::cuda::check_on_context_device(context, device, "q_fp8");
}

TopkParams make_params(const IndexerTopkArgs& args, const IndexerTopkShape& shape, void* workspace) {
  TopkParams p;
  p.q = static_cast<const std::uint8_t*>(args.q_fp8.data);
  p.stride_q_t = args.q_fp8.stride[0];
  p.stride_q_h = args.q_fp8.stride[1];
  p.head_weights = static_cast<const float*>(args.head_weights.data);
  p.stride_w_t = args.head_weights.stride[0];
  p.stride_w_h = args.head_weights.stride[1];
  p.heads = static_cast<int>(shape.heads);
  p.positions = args.positions.data;
  p.positions_i64 = args.positions.dtype == DType::kI64;
  p.stride_positions = args.positions.stride[0];
  p.token_to_request = args.token_to_request.data;
  p.requests_i64 = args.token_to_request.dtype == DType::kI64;
  p.stride_requests = args.token_to_request.stride[0];
  p.block_table = static_cast<const std::int32_t*>(args.block_table.data);
  p.stride_table_r = args.block_table.stride[0];
  p.stride_table_c = args.block_table.stride[1];
  p.table_rows = args.block_table.shape[0];
  p.pages = static_cast<const std::uint8_t*>(args.key_cache.pages.data);
  p.page_stride = args.key_cache.pages.stride[0];
  p.page_size = args.key_cache.page_size();
  p.num_pages = args.key_cache.num_pages();
  const std::int64_t used_page_stride = p.num_pages > 1 ? p.page_stride : 0;
  p.pages_aligned_16 = reinterpret_cast<std::uintptr_t>(p.pages) % 16 == 0 && used_page_stride % 16 == 0;
  p.tokens = shape.tokens;
  p.top_k = static_cast<int>(shape.top_k);
  p.capacity = shape.capacity;
  p.keys = static_cast<std::uint32_t*>(workspace);
  p.topk = static_cast<std::int32_t*>(args.topk_indices.data);
  p.stride_topk_t = args.topk_indices.stride[0];
  return p;
}

}  // namespace

Expected<std::size_t> layer_cuda::indexer_topk_workspace_size(const Context& context, const IndexerTopkArgs& args,
                                                             const IndexerTopkShape& shape) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));  // the query rejects what the call would
  return workspace_bytes_for(shape.tokens, shape.capacity);
}

Status layer_cuda::indexer_topk(const Context& context, const IndexerTopkArgs& args, const IndexerTopkShape& shape,
                                void* workspace) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  if (shape.tokens == 0) return Status::Ok();
  const TopkParams params = make_params(args, shape, workspace);
  const auto cuda_stream = static_cast<cudaStream_t>(context.stream());
  if (shape.capacity > 0) {
    const dim3 grid(static_cast<unsigned>((shape.capacity + kEntryTile - 1) / kEntryTile),
                    static_cast<unsigned>(std::min<std::int64_t>(shape.tokens, 65535)));
    // Above the 48 KiB default: opt in (a host-side attribute, capture-safe, cheap to repeat).
    const cudaError_t attribute = cudaFuncSetAttribute(
        indexer_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kLogitSharedBytes));
    if (attribute != cudaSuccess) {
      return internal_error(runtime_format("cudaFuncSetAttribute failed: {}", cudaGetErrorString(attribute)));
    }
    indexer_logits_kernel<<<grid, kLogitThreads, kLogitSharedBytes, cuda_stream>>>(params);
  }
  const auto select_blocks = static_cast<unsigned>(std::min<std::int64_t>(shape.tokens, std::int64_t{1} << 30));
  indexer_select_kernel<<<select_blocks, kSelectThreads, 0, cuda_stream>>>(params);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    return internal_error(runtime_format("kernel launch failed: {}", cudaGetErrorString(error)));
  return Status::Ok();
}

}  // namespace smla
