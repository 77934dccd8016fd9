// How the producer warpgroup of the sm90 attention kernel reads one KV token
// and writes it as a bf16 K row into a 128-byte-swizzled tile.
//
// A row is a list of 16-byte source units: FP8 units (16 e4m3 codes, expanded
// to 16 bf16 values with the unit's scale) followed by bf16 units (8 values,
// copied). kParts threads share a key; thread `part` takes units part,
// part + kParts, ... so that one 8-thread phase of a store covers 8 distinct
// 16-byte columns of the swizzled tile (no bank conflicts). Every byte offset
// comes from the format traits (include/smla/kv_format.h).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/cuda/common/kv_loaders.cuh"
#include "src/cuda/sm90/sm90_ptx.cuh"
#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda::sm90 {

struct NoScales {};

// What an invalid key's loads read (Sm90RowLoader::load): zero bytes, as long as the
// longest row (V3.2's 656 bytes) and aligned for 16-byte loads, and scale bytes 0x7F
// (V4: 2^0, which keeps the fast scale decoding; V3.2: a finite f32): zero rows either way.
static __device__ __align__(16) const std::uint8_t kZeroRow[1024] = {};
static __device__ __align__(16) const std::uint8_t kZeroRowScales[16] = {
    0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F};

// A/B switch of the V4 scales' fast decoding (V4Units::decode_scales; docs/PERF.md, session 26).
#ifndef SMLA_SM90_FAST_SCALES
#define SMLA_SM90_FAST_SCALES 1
#endif
inline constexpr bool kFastScaleDecode = SMLA_SM90_FAST_SCALES != 0;

// The page and entry of a slot, like page_base() but with a shift for
// power-of-two page sizes (the usual ones): a 32-bit division costs the
// producer more than the rest of a key's address arithmetic.
__device__ __forceinline__ const std::uint8_t* split_slot(const KvSourceParams& src, std::uint32_t slot,
                                                          std::uint32_t* entry) {
  const std::uint32_t page_size = static_cast<std::uint32_t>(src.page_size);
  const std::uint32_t page =
      (page_size & (page_size - 1)) == 0 ? slot >> (__ffs(static_cast<int>(page_size)) - 1) : slot / page_size;
  *entry = slot - page * page_size;
  return src.pages + static_cast<std::int64_t>(page) * src.page_stride_bytes;
}

// Where one token's bytes are: its data row and (for formats with a scale footer) its scales.
struct RowLocation {
  const std::uint8_t* row = nullptr;
  const std::uint8_t* scales = nullptr;
};

// The DeepSeek formats' rows: FP8 NoPE units, then bf16 RoPE units.
template <class FormatTraits>
struct NopeRopeUnits {
  using Format = FormatTraits;
  static constexpr int kDim = Format::kHeadDim;
  static constexpr int kFp8Units = Format::kNopeDim / 16;
  static constexpr int kBf16Units = Format::kRopeDim * 2 / 16;
};

// Plain rows (no scales in the row), row_stride_bytes apart in a page.
struct PlainRowUnits {
  using Scales = NoScales;
  static constexpr bool kScaleFooter = false;
  __device__ static RowLocation locate(const KvSourceParams& src, std::uint32_t slot) {
    std::uint32_t entry = 0;
    const std::uint8_t* page = split_slot(src, slot, &entry);
    return {page + static_cast<std::int64_t>(entry) * src.row_stride_bytes, nullptr};
  }
  __device__ static int unit_offset(int unit) { return 16 * unit; }
  __device__ static Scales load_scales(const RowLocation&) { return {}; }
};

// DeepSeek-V4: 448 e4m3 NoPE then 64 bf16 RoPE in the data row; 7 UE8M0 scales
// (plus a pad byte) in the page's scale rows.
struct V4Units : NopeRopeUnits<V4Fp8Format> {
  using Scales = uint2;
  // Measured on an H100: 4 threads a key with one pass ahead beat 8 threads a key
  // with three passes ahead by 1.5x (docs/PERF.md).
  static constexpr int kParts = 4;
  static constexpr int kPassesAhead = 1;  // 9 units a thread
  static constexpr int kRowBytes = Format::kDataBytes;  // from RowLocation::row
  static constexpr bool kScaleFooter = true;            // scales elsewhere in the page
  static_assert(Format::rope_offset(0, 1) == Format::kNopeDim && Format::kScaleBytes == sizeof(Scales));
  __device__ static RowLocation locate(const KvSourceParams& src, std::uint32_t slot) {
    std::uint32_t entry = 0;
    const std::uint8_t* page = split_slot(src, slot, &entry);
    return {page + Format::nope_offset(entry, src.page_size), page + Format::scale_offset(entry, src.page_size)};
  }
  __device__ static int unit_offset(int unit) { return 16 * unit; }
  __device__ static Scales load_scales(const RowLocation& at) { return __ldg(reinterpret_cast<const uint2*>(at.scales)); }
  // A power of two: applied as a bf16x2 multiply (e4m3x4_to_bf16x4's bf16 overload;
  // measured faster than the f32 multiply, which is as exact).
  __device__ static __nv_bfloat162 unit_scale(const Scales& scales, int unit, float /*fp8_scale*/) {
    const int tile = unit * 16 / Format::kTile;
    const std::uint32_t word = tile < 4 ? scales.x : scales.y;
    return ue8m0_to_bf16x2((word >> (8 * (tile % 4))) & 0xFFu);
  }

  // The same scales decoded all at once (a key's four threads each use all seven):
  // a byte b in 1..254 is the bf16 whose exponent field is b, one byte permute and one
  // shift for both copies; a key holding 0 (2^-127, a bf16 subnormal) or 0xFF (NaN)
  // anywhere takes ue8m0_to_bf16x2 for all seven, so the result is unit_scale's.
  static constexpr bool kDecodesScales = true;
  struct DecodedScales {
    __nv_bfloat162 tile[Format::kNumTiles];
  };
  __device__ static DecodedScales decode_scales(const Scales& scales) {
    static_assert(Format::kNumTiles == 7 && Format::kScaleBytes == 8);
    DecodedScales decoded;
#pragma unroll
    for (int tile = 0; tile < Format::kNumTiles; ++tile) {
      const std::uint32_t word = tile < 4 ? scales.x : scales.y;
      // byte tile % 4 into bytes 0 and 2, zeros (selector 4: byte 0 of the zero operand) into 1 and 3
      const std::uint32_t pair = __byte_perm(word, 0u, 0x4040u + 0x0101u * (tile % 4)) << 7;
      decoded.tile[tile] = *reinterpret_cast<const __nv_bfloat162*>(&pair);
    }
    const std::uint32_t last_three = (scales.y & 0x00FFFFFFu) | 0x01000000u;  // the pad byte as 1: neither 0 nor 0xFF
    if (has_zero_or_full_byte(scales.x) || has_zero_or_full_byte(last_three)) {
#pragma unroll
      for (int tile = 0; tile < Format::kNumTiles; ++tile) decoded.tile[tile] = unit_scale(scales, 4 * tile, 0.0f);
    }
    return decoded;
  }
  // Whether any byte of `word` is 0x00 or 0xFF (the zero-byte test on it and on its complement).
  __device__ static bool has_zero_or_full_byte(std::uint32_t word) {
    const auto has_zero = [](std::uint32_t v) { return ((v - 0x01010101u) & ~v & 0x80808080u) != 0; };
    return has_zero(word) || has_zero(~word);
  }
};

// DeepSeek-V3.2: 512 e4m3, 4 f32 scales, 64 bf16 RoPE, token-contiguous.
struct V32Units : NopeRopeUnits<V32Fp8Format> {
  using Scales = float4;
  // 4 threads a key with one pass ahead (10 units a thread) beat 8 with two passes
  // ahead by 11% in prefill once CTA pairs halved each producer's keys (docs/PERF.md).
  static constexpr int kParts = 4;
  static constexpr int kPassesAhead = 1;
  static constexpr int kRowBytes = Format::kBytesPerToken;  // scales inside the row
  static constexpr bool kScaleFooter = false;
  static_assert(Format::kScaleBytes == sizeof(Scales) && Format::scale_offset(0, 1) % 16 == 0);
  __device__ static RowLocation locate(const KvSourceParams& src, std::uint32_t slot) {
    std::uint32_t entry = 0;
    const std::uint8_t* row = split_slot(src, slot, &entry) + Format::nope_offset(entry, src.page_size);
    return {row, row + Format::scale_offset(0, 1)};
  }
  __device__ static int unit_offset(int unit) {
    return unit < kFp8Units ? 16 * unit : static_cast<int>(Format::rope_offset(0, 1)) + 16 * (unit - kFp8Units);
  }
  __device__ static Scales load_scales(const RowLocation& at) { return __ldg(reinterpret_cast<const float4*>(at.scales)); }
  __device__ static float unit_scale(const Scales& scales, int unit, float /*fp8_scale*/) {
    switch (unit * 16 / Format::kTile) {
      case 0: return scales.x;
      case 1: return scales.y;
      case 2: return scales.z;
      default: return scales.w;
    }
  }
};

// Plain e4m3 rows with one per-tensor scale.
struct Fp8RowUnits : PlainRowUnits {
  using Format = Fp8RowsFormat;
  static constexpr int kDim = Format::kHeadDim;
  static constexpr int kFp8Units = Format::kHeadDim / 16;
  static constexpr int kBf16Units = 0;
  static constexpr int kParts = 8;
  static constexpr int kPassesAhead = 3;  // 3 x 4 units in flight per thread
  static constexpr int kRowBytes = Format::kBytesPerToken;
  __device__ static float unit_scale(const Scales&, int, float fp8_scale) { return fp8_scale; }
};

// Plain bf16 rows of kDimValue values (the bf16 paged format and the flat prefill workspace).
template <int kDimValue>
struct Bf16RowUnits : PlainRowUnits {
  static constexpr int kDim = kDimValue;
  static constexpr int kFp8Units = 0;
  static constexpr int kBf16Units = kDim * 2 / 16;
  static constexpr int kParts = 8;
  static constexpr int kPassesAhead = 1;  // 8 or 9 units a pass: one pass ahead fits the registers
  static constexpr int kRowBytes = kDim * 2;
  __device__ static float unit_scale(const Scales&, int, float) { return 1.0f; }
};

// The sm90 kernel's units of a row source (an entry of KernelRows, sparse_attention_launch.h).
template <class Rows>
using UnitsOf = typename decltype(row_code_of<Rows, V4Units, V32Units, Fp8RowUnits, Bf16RowUnits>())::type;

// One thread's share of one key: its raw units and the row's scales, held in
// registers between the load (issued a round early) and the store.
template <class Units>
struct Sm90RowLoader {
  static constexpr int kDim = Units::kDim;
  static constexpr int kParts = Units::kParts;
  static constexpr int kPassesAhead = Units::kPassesAhead;
  static constexpr int kUnits = Units::kFp8Units + Units::kBf16Units;
  static constexpr int kUnitsPerPart = kUnits / kParts;
  static constexpr int kFp8UnitsPerPart = Units::kFp8Units / kParts;  // units j < this are FP8
  // Rows without FP8 units need no expansion: the producer copies them (copy_async).
  static constexpr bool kCopiesRows = Units::kFp8Units == 0;
  static_assert(kDim % 64 == 0, "K rows are whole 64-value (128-byte) swizzle rows");

  struct Share {
    uint4 units[kUnitsPerPart];
    typename Units::Scales scales;
  };

  // Both unit kinds are 16 bytes apart in their segment and the FP8 segment ends
  // on a multiple of kParts, so unit part + kParts j sits at a constant offset
  // from unit part: one base address a key, immediates for the rest.
  static_assert(Units::kFp8Units % kParts == 0 && kUnits % kParts == 0);

  // An invalid key (`valid` false) reads kZeroRow instead of a row of the cache:
  // zero units, so every key takes the same loads and no share needs zeroing (an
  // invalid index is never dereferenced).
  __device__ static void load(const KvSourceParams& src, std::uint32_t slot, bool valid, int part, Share& share) {
    static_assert(Units::kRowBytes <= sizeof(kZeroRow) && sizeof(typename Units::Scales) <= sizeof(kZeroRowScales));
    RowLocation at = Units::locate(src, slot);
    if (!valid) at = {kZeroRow, kZeroRowScales};
    const std::uint8_t* base = at.row + 16 * part;
#pragma unroll
    for (int j = 0; j < kUnitsPerPart; ++j) {
      share.units[j] = __ldg(reinterpret_cast<const uint4*>(base + Units::unit_offset(kParts * j)));
    }
    share.scales = Units::load_scales(at);
  }

  // Asks L2 for a key's bytes ahead of load(): the row as one bulk prefetch
  // (16-byte aligned, a multiple of 16 bytes) by `half` 0, the scale footer by `half` 1.
  __device__ static void prefetch_l2(const KvSourceParams& src, std::uint32_t slot, int half) {
    static_assert(Units::kRowBytes % 16 == 0);
    const RowLocation at = Units::locate(src, slot);
    if (half == 0) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(at.row), "n"(Units::kRowBytes) : "memory");
    } else if (Units::kScaleFooter) {
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(at.scales) : "memory");
    }
  }

  // The key of a round (0 .. 128 / kParts - 1) and the part of it that producer thread
  // `thread` (0..127) takes. A 16-byte shared store serves 8 threads at a time, and
  // they must hit 8 distinct 16-byte columns of the 128-byte swizzle row. With 4 parts
  // the 8 threads are two keys next to each other (rows differing in bit 0, which the
  // swizzle XORs into the column): FP8 units land in even columns of one row, odd
  // ones of the other. With 8 parts each group of 16 threads takes keys 2i and 2i + 1,
  // four parts of each per 8 threads, the second key's parts offset by 4: the same
  // pairing for FP8 units, and bf16 units (parts p -> column p) fill all 8 columns.
  // (One key's 8 parts in 8 threads would put parts p and p + 4 on one column.)
  __device__ static int part_of(int thread) {
    if constexpr (kParts == 8) {
      const int second_key = (thread / 4) % 2;
      return thread % 4 + 4 * (((thread / 8) % 2) ^ second_key);
    } else {
      return thread % kParts;
    }
  }
  __device__ static int key_of(int thread) {
    if constexpr (kParts == 8) {
      return 2 * (thread / 16) + (thread / 4) % 2;
    } else {
      return thread / kParts;
    }
  }
  static_assert(kParts == 4 || kParts == 8);

  // Writes the share into row `key` of a K tile (kDim / 64 swizzled 64-row regions of 8 KB).
  // Units j < kFp8UnitsPerPart are FP8 for every part: a compile-time split (testing
  // unit < kFp8Units instead left a runtime branch per unit; V3.2 prefill +4%).
  // kDecodedScales: a format's scales decoded once for the whole share (V4Units::decode_scales),
  // else each unit's on its own (unit_scale).
  template <bool kDecodedScales>
  __device__ static void store(std::uint8_t* tile, int key, int part, const Share& share, float fp8_scale) {
    constexpr bool kDecoded = kDecodedScales && requires { Units::kDecodesScales; };
    [[maybe_unused]] const auto decoded = [&] {
      if constexpr (kDecoded) {
        return Units::decode_scales(share.scales);
      } else {
        return 0;
      }
    }();
#pragma unroll
    for (int j = 0; j < kUnitsPerPart; ++j) {
      const int unit = part + kParts * j;
      if (j < kFp8UnitsPerPart) {
        const int dim = 16 * unit;
        uint4 low, high;
        if constexpr (kDecoded) {
          // unit part + kParts j lies in tile j: a compile-time index, so the decoded scales stay in registers
          static_assert(Units::Format::kTile == 16 * kParts);
          expand_unit_by(share.units[j], decoded.tile[j], &low, &high);
        } else {
          expand_unit_by(share.units[j], Units::unit_scale(share.scales, unit, fp8_scale), &low, &high);
        }
        *reinterpret_cast<uint4*>(tile + element_offset(key, dim)) = low;
        *reinterpret_cast<uint4*>(tile + element_offset(key, dim + 8)) = high;
      } else {
        const int dim = 16 * Units::kFp8Units + 8 * (unit - Units::kFp8Units);
        *reinterpret_cast<uint4*>(tile + element_offset(key, dim)) = share.units[j];
      }
    }
  }

  // Copies this part's units of a bf16 row (nullptr: a key not attended, whose
  // units are zeroed) straight into row `key` of a K tile with cp.async (the
  // caller commits and waits). Units j in [kFirst, kEnd) of the part only: unit
  // part + kParts j (kParts is 8 for copied rows) is column unit `part` of the
  // tile's 64-column region j, so a range is a column range, and every unit of
  // the part sits at one swizzled offset plus j regions.
  template <int kFirst = 0, int kEnd = kUnitsPerPart>
  __device__ static void copy_async(std::uint8_t* tile, int key, int part, const std::uint8_t* row,
                                    std::uint64_t l2_policy) {
    static_assert(kCopiesRows && kParts == 8 && 0 <= kFirst && kFirst <= kEnd && kEnd <= kUnitsPerPart);
    constexpr int kRegionBytes = 64 * kSwizzleRowBytes;
    std::uint8_t* at = tile + swizzled_offset(key, part);
    if (row == nullptr) {
#pragma unroll
      for (int j = kFirst; j < kEnd; ++j) *reinterpret_cast<uint4*>(at + j * kRegionBytes) = make_uint4(0, 0, 0, 0);
      return;
    }
    const std::uint8_t* base = row + 16 * part;
    const std::uint32_t to = smem_address(at);
#pragma unroll
    for (int j = kFirst; j < kEnd; ++j) {
      cp_async_16_keep(to + j * kRegionBytes, base + Units::unit_offset(kParts * j), l2_policy);
    }
  }

  // Byte offset of value `dim` (a multiple of 8) of row `row` in a swizzled tile of 64 rows.
  __device__ static std::uint32_t element_offset(int row, int dim) {
    return static_cast<std::uint32_t>((dim / 64) * (64 * kSwizzleRowBytes)) + swizzled_offset(row, (dim % 64) / 8);
  }
};

}  // namespace smla::cuda::sm90
