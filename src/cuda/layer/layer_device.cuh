// Internal: device helpers of the CUDA layer ops. A "warp row" keeps element
// i of a row in lane i % 32 (slot i / 32 of that lane's registers), so loads
// and stores are coalesced and the GPT-J pair (2p, 2p+1) sits in lanes
// (l, l^1) of the same register slot whenever the rotated block starts at a
// multiple of 32 (448 for the 512-dim rows, 64 for the indexer's 128 dims).
//
// Every scalar conversion is the shared host/device one (smla/numeric.h,
// kv_format.h, src/core/kv_rows.h) so the cache bytes equal the host codec's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/core/kv_rows.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/cuda/layer/layer_cuda_host.h"

namespace smla::layer_cuda {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
inline constexpr int kWarpSize = 32;

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) & (kWarpSize - 1); }

__device__ __forceinline__ std::int64_t load_index(const IndexVectorRef& v, std::int64_t i) {
  if (v.is_i64) return static_cast<const std::int64_t*>(v.data)[i * v.stride];
  return static_cast<const std::int32_t*>(v.data)[i * v.stride];
}

// Butterfly reductions: every lane ends with the same value (each step adds
// the same two partials in either order).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

// Largest finite |x| contribution of one value (NaN/Inf do not enter a tile's amax).
__device__ __forceinline__ float finite_abs(float x) {
  const float a = fabsf(x);
  return detail::is_finite_f32(a) ? a : 0.0f;
}

// Lane p holds cos/sin of pair p at `position`, rounded to f32 once from
// double (as RopeTable does; sin carries the direction's sign). A position
// outside [0, max_positions) leaves the row unrotated (active == false).
struct WarpRope {
  float cos_lane = 1.0f;
  float sin_lane = 0.0f;
  bool active = false;
};

__device__ __forceinline__ WarpRope warp_rope(const RopeFrequencies& f, std::int64_t position) {
  WarpRope rope;
  rope.active = position >= 0 && position < f.max_positions;
  if (rope.active) {
    double s = 0.0, c = 1.0;
    sincos(__dmul_rn(static_cast<double>(position), f.inv_freq[lane_id()]), &s, &c);
    rope.cos_lane = __double2float_rn(c);
    rope.sin_lane = f.sign * __double2float_rn(s);
  }
  return rope;
}

// Rotates rope element r (0..63) of a warp row; this lane holds it as `v` and
// lane^1 holds element r^1. Every lane of the warp must call it together.
// Same f32 operations as the host (src/cpu/layer/rope_f32.h), never contracted.
__device__ __forceinline__ float rotate_element(float v, int r, const WarpRope& rope) {
  const float partner = __shfl_xor_sync(kFullMask, v, 1);
  const float c = __shfl_sync(kFullMask, rope.cos_lane, r >> 1);
  const float s = __shfl_sync(kFullMask, rope.sin_lane, r >> 1);
  if (!rope.active) return v;
  if ((r & 1) == 0) return __fsub_rn(__fmul_rn(v, c), __fmul_rn(partner, s));  // even' = e c - o s
  return __fadd_rn(__fmul_rn(partner, s), __fmul_rn(v, c));                    // odd'  = e s + o c
}

// Rotates the 64 dims starting at slot kFirstSlot*32 of a warp row of kSlots registers.
template <int kSlots, int kFirstSlot>
__device__ __forceinline__ void rotate_warp_row(float (&v)[kSlots], const WarpRope& rope) {
  static_assert(kFirstSlot + 2 <= kSlots);
  const int lane = lane_id();
#pragma unroll
  for (int k = kFirstSlot; k < kFirstSlot + 2; ++k)
    v[k] = rotate_element(v[k], (k - kFirstSlot) * kWarpSize + lane, rope);
}

// Loads a warp row of kSlots*32 values (f32 or bf16 bits) from `row`.
template <class In, int kSlots>
__device__ __forceinline__ void load_warp_row(const In* row, float (&v)[kSlots]) {
  const int lane = lane_id();
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if constexpr (sizeof(In) == 2) {
      v[k] = bf16_to_f32(row[k * kWarpSize + lane]);
    } else {
      v[k] = row[k * kWarpSize + lane];
    }
  }
}

inline constexpr int kRow512Slots = V4Fp8Format::kHeadDim / kWarpSize;        // 16
inline constexpr int kRope512FirstSlot = V4Fp8Format::kNopeDim / kWarpSize;   // 14
inline constexpr int kIndexerSlots = IndexerFp8Format::kHeadDim / kWarpSize;  // 4
inline constexpr int kIndexerRopeFirstSlot = (IndexerFp8Format::kHeadDim - IndexerFp8Format::kRopeDim) / kWarpSize;

__device__ __forceinline__ std::uint8_t* page_of(const PagedCacheRef& cache, std::int64_t slot, std::int64_t* entry) {
  *entry = slot % cache.page_size;
  return cache.pages + (slot / cache.page_size) * cache.page_stride_bytes;
}

// Power-of-two FP8 quantization of one warp-distributed tile: `values` holds
// the lane's bf16-representable values of the tile, returns the exponent e of
// the production rule (kv_format.h), the same in every lane.
__device__ __forceinline__ int warp_tile_exponent(float lane_amax) { return fp8_tile_exponent(warp_max(lane_amax)); }

// Which row layouts warp_store_row_512 writes lane-parallel: V4's tiles (64
// values, one UE8M0 byte each, a pad byte) and plain bf16 or scaled e4m3 rows.
template <class Format>
constexpr bool warp_v4_tiles() {
  if constexpr (Format::kLayout == KvRowLayout::kTiledNopeRope) {
    return Format::kTile == 2 * kWarpSize && Format::kNopeDim == kRope512FirstSlot * kWarpSize &&
           Format::kScaleBytesPerTile == 1 && Format::kScaleBytes == Format::kNumTiles + 1;
  }
  return false;
}
template <class Format>
inline constexpr bool kWarpPlainRows = Format::kLayout == KvRowLayout::kPlainRows &&
                                       (Format::kStorage == DType::kBF16 ||
                                        (Format::kStorage == DType::kE4M3 && Format::kPerTensorScale));

// Encodes a warp row of 512 values (any f32; rounded to bf16 first) as token
// `slot` of a 512-dim cache, byte-identical to detail::encode_token<Format>.
template <class Format>
__device__ __forceinline__ void warp_store_row_512(const float (&v)[kRow512Slots], const PagedCacheRef& cache,
                                                   std::int64_t slot) {
  const int lane = lane_id();
  std::int64_t entry = 0;
  std::uint8_t* page = page_of(cache, slot, &entry);
  if constexpr (warp_v4_tiles<Format>()) {  // a tile is two register slots of the warp row
    std::uint8_t* nope = page + Format::nope_offset(entry, cache.page_size);
    std::uint8_t* rope = page + Format::rope_offset(entry, cache.page_size);
    std::uint8_t* scales = page + Format::scale_offset(entry, cache.page_size);
    std::uint8_t scale_byte = 0;  // lane j < kNumTiles writes tile j's scale, lane kNumTiles the pad byte
#pragma unroll
    for (int tile = 0; tile < Format::kNumTiles; ++tile) {
      const float a = round_to_bf16(v[2 * tile]);
      const float b = round_to_bf16(v[2 * tile + 1]);
      const int e = warp_tile_exponent(fmaxf(finite_abs(a), finite_abs(b)));
      nope[(2 * tile) * kWarpSize + lane] = f32_to_e4m3(ldexpf(a, -e));
      nope[(2 * tile + 1) * kWarpSize + lane] = f32_to_e4m3(ldexpf(b, -e));
      if (lane == tile) scale_byte = ue8m0_from_exponent(e);
    }
    if (lane <= Format::kNumTiles) scales[lane] = scale_byte;
#pragma unroll
    for (int k = kRope512FirstSlot; k < kRow512Slots; ++k) {
      const int i = (k - kRope512FirstSlot) * kWarpSize + lane;
      detail::store_u16(rope + 2 * i, f32_to_bf16(v[k]));
    }
  } else if constexpr (kWarpPlainRows<Format> && Format::kStorage == DType::kBF16) {
    std::uint8_t* out = page + entry * Format::kBytesPerToken;
#pragma unroll
    for (int k = 0; k < kRow512Slots; ++k) detail::store_u16(out + 2 * (k * kWarpSize + lane), f32_to_bf16(v[k]));
  } else if constexpr (kWarpPlainRows<Format>) {
    std::uint8_t* out = page + entry * Format::kBytesPerToken;
#pragma unroll
    for (int k = 0; k < kRow512Slots; ++k) {
      out[k * kWarpSize + lane] = f32_to_e4m3(__fdiv_rn(round_to_bf16(v[k]), cache.fp8_scale));
    }
  } else {
    // Any other layout: lane 0 gathers the row and writes it with the shared codec
    // (exact, not fast; a lane-parallel branch above can follow).
    float row[kRow512Slots * kWarpSize];
    for (int k = 0; k < kRow512Slots; ++k) {
      for (int from = 0; from < kWarpSize; ++from) row[k * kWarpSize + from] = __shfl_sync(kFullMask, v[k], from);
    }
    if (lane == 0) detail::encode_token<Format>(row, page, cache.page_size, entry, cache.fp8_scale);
  }
}

// Encodes a warp row of 128 values as indexer key `slot` (bf16 rounding, one
// power-of-two scale for the row), byte-identical to encode_indexer_key.
__device__ __forceinline__ void warp_store_indexer_key(const float (&v)[kIndexerSlots], const PagedCacheRef& cache,
                                                       std::int64_t slot) {
  const int lane = lane_id();
  std::int64_t entry = 0;
  std::uint8_t* page = page_of(cache, slot, &entry);
  float rounded[kIndexerSlots];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kIndexerSlots; ++k) {
    rounded[k] = round_to_bf16(v[k]);
    amax = fmaxf(amax, finite_abs(rounded[k]));
  }
  const int e = warp_tile_exponent(amax);
  std::uint8_t* codes = page + IndexerFp8Format::data_offset(entry, cache.page_size);
#pragma unroll
  for (int k = 0; k < kIndexerSlots; ++k) codes[k * kWarpSize + lane] = f32_to_e4m3(ldexpf(rounded[k], -e));
  if (lane == 0) {
    const float scale = ldexpf(1.0f, e);
    memcpy(page + IndexerFp8Format::scale_offset(entry, cache.page_size), &scale, sizeof scale);
  }
}

// Picks the kernel of a validated 512-dim cache format (host side).
using layer_detail::visit_row_512_format;

// True when no entry u in (t, n) of `slots` equals `slot`: of several stores
// to one slot only the last in token order writes, as in a serial run. The
// warp scans the later entries together (O(n) loads per storing token).
__device__ __forceinline__ bool warp_is_last_store(const IndexVectorRef& slots, std::int64_t n, std::int64_t t,
                                                   std::int64_t slot) {
  bool later = false;
#pragma unroll 4
  for (std::int64_t u = t + 1 + lane_id(); u < n; u += kWarpSize) later |= load_index(slots, u) == slot;
  return !__any_sync(kFullMask, later);
}

}  // namespace smla::layer_cuda
