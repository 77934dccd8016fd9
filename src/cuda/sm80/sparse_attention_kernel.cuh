// The sparse MLA attention kernel (decode, direct-from-cache prefill and
// flat-workspace prefill). Included only by the per-loader instantiation files
// and the split-KV combine.
//
// One CTA = one query token x kRows query heads x one split of the token's keys.
// Keys are the token's valid main entries followed by its valid extra entries
// (lengths clamped to [0, width]); indices outside [0, num_slots) are masked
// and never dereferenced. Per 32-key tile:
//   1. the raw rows (copied by cp.async one to three tiles earlier, in a ring of
//      p.kv_stages buffers) are expanded to bf16 K rows in shared memory, 8
//      threads per key on interleaved 8-value chunks (no bank conflicts); with
//      two K buffers (p.k_buffers) tile t + 1 is expanded during step 4 of tile t;
//   2. S = Q K^T with mma.sync m16n8k16, each warp a (32 or 16 rows x 16 keys)
//      block over a slice of d_qk (the slices' partial sums meet in the softmax);
//   3. online softmax in the exp2 domain, one row per 256/kRows threads;
//   4. O += P V, each warp owning 64 of the 512 value columns for all rows
//      (V is the first 512 dims of the same K rows).
// Packed MTP (p.pack_tokens = g > 1): the CTA's rows are g consecutive tokens x
// all h_q heads, its keys the deduplicated union of their keys (built by the
// pack prepass, pack_union.cu), each with a mask of the tokens attending it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "src/cuda/common/attention_epilogue.cuh"
#include "src/cuda/common/kv_loaders.cuh"
#include "src/cuda/common/ptx.cuh"
#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

// Threads per CTA for every head tile. (A 16-warp 64-head tile was measured
// 3-6% slower on an H100: twice the ldmatrix traffic for Q and P; docs/PERF.md.)
inline constexpr int kAttentionThreads = 256;
// 16- and 32-head tiles are register-capped to 128 so two CTAs share an SM (the
// 32-head tile used ~150 registers and ran one CTA per SM).
template <int kRows>
constexpr int attention_min_blocks_per_sm() {
  return kRows <= 32 ? 2 : 1;
}

template <class Loader, int kRows>
struct AttentionConfig {
  static constexpr int kThreads = kAttentionThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kKeys = kKeysPerTile;
  static constexpr int kDim = Loader::kHeadDim;
  static constexpr int kRowStride = kDim + 8;   // bf16 elements; +16 B keeps ldmatrix rows in distinct banks
  static constexpr int kPStride = kKeys + 8;    // bf16 elements
  static constexpr int kSStride = kKeys + 4;    // floats
  static constexpr int kMTiles = kRows / 16;
  static constexpr int kThreadsPerKey = kThreads / kKeys;   // loader threads per key, all in one warp
  static constexpr int kColumnsPerWarp = kValueDim / kWarps;  // P V: each warp owns these value columns
  static constexpr int kPvTiles = kColumnsPerWarp / 8;        // n8 tiles per warp
  // S is computed in (kQkRowTiles x 16 rows, 16 keys) blocks, one per warp and d_qk slice:
  // two row tiles share each K fragment, so a QK step loads 3 fragments for 4 MMAs, not 4.
  static constexpr int kQkRowTiles = kMTiles >= 2 ? 2 : 1;
  static constexpr int kQkUnits = kMTiles / kQkRowTiles * (kKeys / 16);
  static constexpr int kDSplit = kWarps / kQkUnits;        // warps sharing one block, each a slice of d_qk
  static constexpr int kThreadsPerRow = kThreads / kRows;
  static constexpr int kKeysPerThread = kKeys / kThreadsPerRow;
  static_assert(kRows == 16 || kRows == 32 || kRows == 64);
  static_assert(kWarps % kQkUnits == 0 && (kDim / 16) % kDSplit == 0);
  static_assert(kValueDim % (kWarps * 16) == 0 && kPvTiles % 2 == 0, "value columns split in 16-column pairs");
  static_assert(kKeys * kThreadsPerKey == kThreads && 32 % kThreadsPerKey == 0, "a key's loader threads in one warp");

  static constexpr int kQBytes = kRows * kRowStride * 2;
  static constexpr int kKBytes = kKeys * kRowStride * 2;
  static constexpr int kRawStageBytes = kKeys * Loader::kRawStride;
  static constexpr int kSBytes = kDSplit * kRows * kSStride * 4;
  static constexpr int kPBytes = kRows * kPStride * 2;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kSOffset = kKOffset + kKBytes;
  static constexpr int kPOffset = kSOffset + kSBytes;
  static constexpr int kAlphaOffset = kPOffset + kPBytes;
  static constexpr int kMOffset = kAlphaOffset + kRows * 4;
  static constexpr int kLOffset = kMOffset + kRows * 4;
  static constexpr int kValidOffset = kLOffset + kRows * 4;        // [kKeys] token masks of the tile in k_s (0: none)
  static constexpr int kFlagOffset = kValidOffset + kKeys * 4;     // [kMaxKvStages][kKeys] loaded | source << 1 | mask << 2
  static constexpr int kRawOffset = (kFlagOffset + kMaxKvStages * kKeys * 4 + 15) / 16 * 16;  // then the raw ring
  static_assert(kSOffset % 16 == 0 && kPOffset % 16 == 0 && kRawStageBytes % 16 == 0);
  // The raw ring, then (with two K buffers) the second K tile.
  static constexpr int smem_bytes(int stages, int k_buffers) {
    return kRawOffset + stages * kRawStageBytes + (k_buffers - 1) * kKBytes;
  }
};

// The rows of a portable CTA's tile: row r is token first_token + r / per_token,
// head head0 + r % per_token (per_token = h_q when packed, the tile's rows otherwise).
struct TileRows {
  const SparseAttentionParams& p;
  int first_token;
  int head0;
  int per_token;
  __device__ __forceinline__ int token(int row) const { return first_token + row / per_token; }
  __device__ __forceinline__ int head(int row) const { return head0 + row % per_token; }
  __device__ __forceinline__ bool live(int row) const { return row < p.pack_tokens * per_token && head(row) < p.num_heads; }
};

__device__ __forceinline__ int clamped_length(const KvSourceParams& src, int token) {
  if (src.lengths == nullptr) return src.topk;
  const int len = src.lengths[static_cast<std::int64_t>(token) * src.stride_lengths_t];
  return len < 0 ? 0 : (len > src.topk ? src.topk : len);
}

// A key list's length and how many of its first keys come from the main source.
struct KeyCounts {
  int n_main;
  int n_keys;
};
// A token's main-then-extra list, from the length values on the device (so a
// captured graph stays valid when lengths change).
__device__ __forceinline__ KeyCounts token_key_counts(const SparseAttentionParams& p, int token) {
  const int n_main = clamped_length(p.source[0], token);
  return {n_main, n_main + (p.num_sources > 1 ? clamped_length(p.source[1], token) : 0)};
}

// The keys [begin, end) of a list that split `split` attends: the splits take equal
// shares rounded up to whole tiles of kTileKeys, so the last ones may be empty
// (begin >= end: the split writes its rows as empty). Both kernels split this way.
struct SplitKeys {
  int n_main;
  int begin;
  int end;
};
template <int kTileKeys>
__device__ __forceinline__ SplitKeys split_keys(KeyCounts counts, int num_splits, int split) {
  const int per_split = ((counts.n_keys + num_splits - 1) / num_splits + kTileKeys - 1) / kTileKeys * kTileKeys;
  const int begin = split * per_split;
  return {counts.n_main, begin, min(counts.n_keys, begin + per_split)};
}

// The source a key reads (0: main, 1: extra), spelled as a choice between the two
// members rather than an index into them.
__device__ __forceinline__ const KvSourceParams& key_source(const SparseAttentionParams& p, int source) {
  return source == 0 ? p.source[0] : p.source[1];
}

// Where one key of the tile comes from: the slot and whether it is attended.
struct KeySlot {
  std::uint32_t slot = 0;
  std::uint32_t mask = 0;  // the CTA's tokens attending it (bit 0 alone when unpacked)
  int source = 0;
  bool valid = false;
};

// A key whose index value (or packed union entry) has been requested but not yet
// looked at. Loads are issued a tile (or producer pass) before the key is used
// and checked only then: checking right after the load made every tile wait a
// full load latency before it could even request its rows (ncu, docs/PERF.md).
struct PendingKey {
  std::uint32_t word = 0;  // the index value (unpacked), or slot | source << 31 (packed)
  std::uint32_t mask = 0;  // packed: the tokens attending the key
  int source = 0;
  bool listed = false;     // the position lies inside the split's range
};

// `cta` is the token (unpacked) or the token group (packed). kMayPack false: a
// kernel that never packs (the sm90 kernel) skips the test of p.pack_tokens.
template <bool kMayPack = true>
__device__ __forceinline__ PendingKey request_key(const SparseAttentionParams& p, int cta, int position, int end,
                                                  int n_main) {
  PendingKey key;
  if (position >= end) return key;
  key.listed = true;
  if (kMayPack && p.pack_tokens > 1) {
    const uint2 entry =
        __ldg(reinterpret_cast<const uint2*>(p.pack_keys) + static_cast<std::int64_t>(cta) * p.pack_capacity + position);
    key.word = entry.x;
    key.mask = entry.y;
    return key;
  }
  key.source = position < n_main ? 0 : 1;
  const KvSourceParams& src = key_source(p, key.source);
  const int column = key.source == 0 ? position : position - n_main;
  key.word = static_cast<std::uint32_t>(__ldg(src.indices + static_cast<std::int64_t>(cta) * src.stride_indices_t + column));
  return key;
}

// Indices outside [0, num_slots) are never dereferenced; union entries were range-checked by the prepass.
template <bool kMayPack = true>
__device__ __forceinline__ KeySlot resolve_key(const SparseAttentionParams& p, const PendingKey& pending) {
  KeySlot key;
  if (!pending.listed) return key;
  if (kMayPack && p.pack_tokens > 1) {
    key.source = static_cast<int>(pending.word >> 31);
    key.slot = pending.word & 0x7FFFFFFFu;
    key.mask = pending.mask;
    key.valid = true;
    return key;
  }
  key.source = pending.source;
  const std::int32_t index = static_cast<std::int32_t>(pending.word);
  const std::int64_t num_slots = key_source(p, pending.source).num_slots;
  key.valid = index >= 0 && static_cast<std::int64_t>(index) < num_slots;
  key.slot = key.valid ? static_cast<std::uint32_t>(index) : 0u;
  key.mask = key.valid ? 1u : 0u;
  return key;
}

template <class Loader, int kRows>
__global__ void __launch_bounds__(kAttentionThreads, attention_min_blocks_per_sm<kRows>())
    sparse_attention_kernel(const __grid_constant__ SparseAttentionParams p) {
  using Cfg = AttentionConfig<Loader, kRows>;
  allow_dependent_launch();
  extern __shared__ __align__(16) std::uint8_t smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + Cfg::kQOffset);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + Cfg::kKOffset);
  std::uint8_t* raw_s = smem + Cfg::kRawOffset;  // p.kv_stages tiles of raw rows
  float* s_s = reinterpret_cast<float*>(smem + Cfg::kSOffset);
  __nv_bfloat16* p_s = reinterpret_cast<__nv_bfloat16*>(smem + Cfg::kPOffset);
  float* alpha_s = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);
  float* m_s = reinterpret_cast<float*>(smem + Cfg::kMOffset);
  float* l_s = reinterpret_cast<float*>(smem + Cfg::kLOffset);
  int* valid_s = reinterpret_cast<int*>(smem + Cfg::kValidOffset);
  int* flag_s = reinterpret_cast<int*>(smem + Cfg::kFlagOffset);

  const int cta = static_cast<int>(blockIdx.x);  // the token, or the token group when packed
  const int head0 = static_cast<int>(blockIdx.y) * kRows;
  const int split = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;

  const bool packed = p.pack_tokens > 1;
  const TileRows rows{p, cta * p.pack_tokens, head0, packed ? p.num_heads : kRows};

  // This split's share of the token's valid keys (packed: of the group's union list).
  const KeyCounts counts =
      packed ? KeyCounts{0, min(max(p.pack_counts[cta], 0), p.pack_capacity)} : token_key_counts(p, cta);
  const auto [n_main, begin, end] = split_keys<Cfg::kKeys>(counts, p.num_splits, split);

  const int softmax_row = tid / Cfg::kThreadsPerRow;
  const int softmax_sub = tid % Cfg::kThreadsPerRow;

  if (begin >= end) {  // nothing to attend in this split (uniform over the CTA)
    write_empty_split_rows<kRows, Cfg::kThreads>(p, split, tid, rows);
    return;
  }

  // Loader role: kThreadsPerKey threads per key of the tile. Raw tiles travel
  // through a ring of p.kv_stages buffers, `lead` tiles ahead of the one being
  // expanded; each key's validity and source sit in flag_s so the expanding
  // thread knows them.
  // With one stage (small shared memory) the next tile is issued right after the
  // current one is expanded, which is also where two stages issue it.
  constexpr int kThreadsPerKey = Cfg::kThreadsPerKey;
  const int my_key = tid / kThreadsPerKey;
  const int my_part = tid % kThreadsPerKey;
  const int stages = p.kv_stages;
  const int lead = stages > 1 ? stages - 1 : 1;
  const int num_tiles = (end - begin + Cfg::kKeys - 1) / Cfg::kKeys;
  auto issue_tile = [&](int tile, const KeySlot& key) {
    const int stage = tile % stages;
    const bool load = tile < num_tiles && key.valid;
    if (load) {
      Loader::template issue<kThreadsPerKey>(raw_s + stage * Cfg::kRawStageBytes + my_key * Loader::kRawStride,
                                             key_source(p, key.source), key.slot, my_part);
    }
    if (my_part == 0) {  // loaded | source << 1 | token mask << 2
      flag_s[stage * Cfg::kKeys + my_key] = (load ? 1 : 0) | (key.source << 1) | static_cast<int>(key.mask << 2);
    }
    cp_async_commit();
  };
  PendingKey upcoming = request_key(p, cta, begin + my_key, end, n_main);
  for (int tile = 0; tile < lead; ++tile) {
    const KeySlot key = resolve_key(p, upcoming);
    upcoming = request_key(p, cta, begin + (tile + 1) * Cfg::kKeys + my_key, end, n_main);
    issue_tile(tile, key);
  }

  // Q rows of this CTA; rows past h_q (or past the packed tokens) are zero and never written out.
  load_query_rows<kRows, Cfg::kDim, Cfg::kThreads, false>(
      p, tid, rows, [&](int row, int unit) { return q_s + row * Cfg::kRowStride + unit * 8; });

  float row_max = -INFINITY;  // raw dot products, replicated over the row's softmax threads
  float row_sum = 0.0f;
  float acc[Cfg::kMTiles][Cfg::kPvTiles][4];
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < Cfg::kPvTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  // The bit of this softmax row's token in the key masks (0 for padding rows).
  const int row_bit = rows.live(softmax_row) ? 1 << (softmax_row / rows.per_token) : 0;
  const int qk_unit = warp % Cfg::kQkUnits;
  const int qk_dpart = warp / Cfg::kQkUnits;
  const int qk_mtile = qk_unit / (Cfg::kKeys / 16) * Cfg::kQkRowTiles;  // first of the block's row tiles
  const int qk_keypair = qk_unit % (Cfg::kKeys / 16);
  constexpr int kStepsPerPart = Cfg::kDim / 16 / Cfg::kDSplit;

  // Expands raw tile `tile` into `k_tile` and refills its ring stage. A key's
  // raw row, flag and K row are touched only by its threads, all in one warp,
  // so warp barriers order them; block barriers publish the K tile.
  auto expand_tile = [&](int tile, __nv_bfloat16* k_tile) {
    cp_async_wait_pending(lead - 1);  // this thread's part of the tile has landed
    __syncwarp();                     // ... and the other parts of its keys
    const int stage = tile % stages;
    const int flag = flag_s[stage * Cfg::kKeys + my_key];
    __nv_bfloat16* krow = k_tile + my_key * Cfg::kRowStride;
    if (my_part == 0) valid_s[my_key] = (flag & 1) ? (flag >> 2) : 0;  // the mask of tokens attending the key
    if (flag & 1) {
      const float fp8_scale = key_source(p, (flag >> 1) & 1).fp8_scale;
      Loader::template dequant<kThreadsPerKey>(raw_s + stage * Cfg::kRawStageBytes + my_key * Loader::kRawStride,
                                               krow, my_part, fp8_scale);
    } else {  // zero rows keep NaN garbage out of P V (P is 0 there, but 0 * NaN is NaN)
      for (int c = my_part; c < Cfg::kDim * 2 / 16; c += kThreadsPerKey) {
        reinterpret_cast<uint4*>(krow)[c] = make_uint4(0, 0, 0, 0);
      }
    }
    __syncwarp();  // the stage is read; refill it
    const KeySlot key = resolve_key(p, upcoming);
    upcoming = request_key(p, cta, begin + (tile + lead + 1) * Cfg::kKeys + my_key, end, n_main);
    issue_tile(tile + lead, key);
  };

  // With two K buffers the expansion of tile t + 1 shares the P V phase of tile t
  // (ALU and shared-memory work beside tensor-core work, one block barrier fewer).
  const bool two_k_buffers = p.k_buffers > 1;
  __nv_bfloat16* k_second = reinterpret_cast<__nv_bfloat16*>(raw_s + stages * Cfg::kRawStageBytes);
  expand_tile(0, k_s);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const __nv_bfloat16* k_cur = two_k_buffers && (tile & 1) ? k_second : k_s;
    __syncthreads();  // K tile and validity complete; previous P V finished with p_s

    // S = Q K^T for one (kQkRowTiles x 16 rows, 16 keys) block per warp, over its slice of d_qk.
    {
      // Independent accumulator sets keep at least 4 MMAs in flight per step.
      constexpr int kChains = Cfg::kQkRowTiles == 1 ? 2 : 1;
      float s_acc[kChains][Cfg::kQkRowTiles][2][4] = {};
      const __nv_bfloat16* a_base = q_s + (qk_mtile * 16 + lane % 16) * Cfg::kRowStride + (lane / 16) * 8;
      const __nv_bfloat16* b_base =
          k_cur + (qk_keypair * 16 + lane % 8 + (lane / 16) * 8) * Cfg::kRowStride + ((lane / 8) % 2) * 8;
      const int first_step = qk_dpart * kStepsPerPart;
#pragma unroll
      for (int i = 0; i < kStepsPerPart; ++i) {
        const int step = first_step + i;
        std::uint32_t b[4];
        ldmatrix_x4(b, b_base + step * 16);
#pragma unroll
        for (int mt = 0; mt < Cfg::kQkRowTiles; ++mt) {
          std::uint32_t a[4];
          ldmatrix_x4(a, a_base + mt * 16 * Cfg::kRowStride + step * 16);
          mma_bf16_16816(s_acc[i % kChains][mt][0], a, b[0], b[1]);
          mma_bf16_16816(s_acc[i % kChains][mt][1], a, b[2], b[3]);
        }
      }
      float* s_part = s_s + qk_dpart * kRows * Cfg::kSStride;
#pragma unroll
      for (int mt = 0; mt < Cfg::kQkRowTiles; ++mt) {
        const int row = (qk_mtile + mt) * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float c[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            c[i] = s_acc[0][mt][j][i];
            if constexpr (kChains > 1) c[i] += s_acc[kChains - 1][mt][j][i];
          }
          const int key = qk_keypair * 16 + j * 8 + 2 * (lane % 4);
          *reinterpret_cast<float2*>(s_part + row * Cfg::kSStride + key) = make_float2(c[0], c[1]);
          *reinterpret_cast<float2*>(s_part + (row + 8) * Cfg::kSStride + key) = make_float2(c[2], c[3]);
        }
      }
    }
    __syncthreads();  // S complete

    // Online softmax: each row is owned by kThreadsPerRow consecutive lanes.
    {
      float scores[Cfg::kKeysPerThread];
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < Cfg::kKeysPerThread; ++i) {
        const int key = i * Cfg::kThreadsPerRow + softmax_sub;  // interleaved: conflict-free reads of s_s
        float s = 0.0f;
#pragma unroll
        for (int d = 0; d < Cfg::kDSplit; ++d) s += s_s[(d * kRows + softmax_row) * Cfg::kSStride + key];
        scores[i] = (valid_s[key] & row_bit) ? s : -INFINITY;  // raw: the scale multiplies differences
        tile_max = fmaxf(tile_max, scores[i]);
      }
      const RowRescale step = advance_row_max(row_max, row_reduce_max<Cfg::kThreadsPerRow>(tile_max), p.scale_log2);
      float tile_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < Cfg::kKeysPerThread; ++i) {
        const float prob = exp2f((scores[i] - step.reference) * p.scale_log2);  // argument <= 0 (or NaN)
        tile_sum += prob;
        p_s[softmax_row * Cfg::kPStride + i * Cfg::kThreadsPerRow + softmax_sub] = __float2bfloat16_rn(prob);
      }
      row_sum = row_sum * step.alpha + row_reduce_sum<Cfg::kThreadsPerRow>(tile_sum);
      if (softmax_sub == 0) alpha_s[softmax_row] = step.alpha;
    }
    __syncthreads();  // P and the rescale factors ready

    // O = alpha * O + P V over this warp's kColumnsPerWarp value columns.
    {
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        const float a_lo = alpha_s[mt * 16 + lane / 4];
        const float a_hi = alpha_s[mt * 16 + lane / 4 + 8];
#pragma unroll
        for (int nt = 0; nt < Cfg::kPvTiles; ++nt) {
          acc[mt][nt][0] *= a_lo;
          acc[mt][nt][1] *= a_lo;
          acc[mt][nt][2] *= a_hi;
          acc[mt][nt][3] *= a_hi;
        }
      }
#pragma unroll
      for (int kstep = 0; kstep < Cfg::kKeys / 16; ++kstep) {
        std::uint32_t a[Cfg::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
          ldmatrix_x4(a[mt], p_s + (mt * 16 + lane % 16) * Cfg::kPStride + kstep * 16 + (lane / 16) * 8);
        }
#pragma unroll
        for (int np = 0; np < Cfg::kPvTiles / 2; ++np) {
          std::uint32_t b[4];
          ldmatrix_x4_trans(b, k_cur + (kstep * 16 + lane % 8 + ((lane / 8) % 2) * 8) * Cfg::kRowStride +
                                   warp * Cfg::kColumnsPerWarp + np * 16 + (lane / 16) * 8);
#pragma unroll
          for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
            mma_bf16_16816(acc[mt][2 * np], a[mt], b[0], b[1]);
            mma_bf16_16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }

    if (tile + 1 < num_tiles) {
      if (!two_k_buffers) __syncthreads();  // every warp is done with the one K buffer
      expand_tile(tile + 1, two_k_buffers && !(tile & 1) ? k_second : k_s);
    }
  }
  cp_async_wait_all();

  // Epilogue: row statistics to shared memory, then each warp writes its columns.
  if (softmax_sub == 0) publish_row_statistics(p, split, rows, softmax_row, row_max, row_sum, m_s, l_s);
  __syncthreads();
  write_output_fragments<Cfg::kMTiles, Cfg::kPvTiles>(p, split, rows, 0, warp * Cfg::kColumnsPerWarp, lane, m_s, l_s,
                                                      [&](int mt, int nt, int i) { return acc[mt][nt][i]; });
}

}  // namespace smla::cuda
