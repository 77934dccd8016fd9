// KV-cache formats. Each format is described exactly once, by a constexpr
// traits type below; codecs, kernels, tests and the CLI read these
// descriptions instead of repeating byte counts.
//
// A cache is a TensorView of pages: [num_pages, page_size, row] where the
// page stride (stride[0]) is taken from the tensor and never recomputed, so
// pages may be padded or interleaved with other layers' pages.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "smla/numeric.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// The runtime name of a format: its index in KvFormats (the list at the end of the traits).
enum class KvFormat : std::uint8_t {
  kV4Fp8,     // DeepSeek-V4 "MODEL1" fp8_ds_mla: 584 B/token, data rows then scale rows per page
  kV32Fp8,    // DeepSeek-V3.2 fp8_ds_mla: 656 B/token, token-contiguous
  kBf16Rows,  // plain bf16 rows [page_size, 512]
  kFp8Rows,   // plain e4m3 rows [page_size, 512] with one per-tensor f32 scale
};

// How a token's bytes are laid out. Code that interprets bytes (the row codec in
// src/core/kv_rows.h, the CPU kernel's SIMD decoder, the layer ops' warp writer)
// branches on this and on the traits, never on a KvFormat value, so a format of
// an existing layout needs no code beyond its traits.
enum class KvRowLayout : std::uint8_t {
  // e4m3 NoPE values in tiles of kTile with a power-of-two scale each (kNumTiles
  // scales of kScaleBytesPerTile bytes, read and written by the traits'
  // tile_scale / store_tile_scale), then kRopeDim bf16 RoPE values; byte
  // positions from nope_offset / scale_offset / rope_offset.
  kTiledNopeRope,
  // The whole kHeadDim-vector in the element type kStorage, token t at t * kBytesPerToken:
  // bf16, or e4m3 times the cache's per-tensor fp8_scale (kPerTensorScale).
  kPlainRows,
};

// The production quantization rule (spec 2.2, CUDA/Triton writers): for a tile
// of bf16-rounded values, amax = max(max|x|, 1e-4) over finite values,
// e = ceil(log2(amax / 448)), stored value e4m3(x * 2^-e), scale 2^e.
// Non-finite inputs do not enter amax; NaN is stored as e4m3 NaN and +-Inf
// saturates to +-448 (times the tile scale).
SMLA_HOST_DEVICE int fp8_tile_exponent(float amax) {
  const float clamped = amax > 1e-4f ? amax : 1e-4f;
  // clamped = m * 2^k with m in [0.5, 1); 448 = 0.875 * 2^9, so the smallest e
  // with 448 * 2^e >= clamped is k - 9 when m <= 0.875 and k - 8 otherwise (exact).
  int k = 0;
  const float m = std::frexp(clamped, &k);
  return m <= 0.875f ? k - 9 : k - 8;
}

// UE8M0 byte of a tile exponent, clamped to [0, 254] so a scale byte is never NaN.
SMLA_HOST_DEVICE std::uint8_t ue8m0_from_exponent(int e) {
  const int biased = e + 127;
  return static_cast<std::uint8_t>(biased < 0 ? 0 : (biased > 254 ? 254 : biased));
}

// ---------------------------------------------------------------------------
// DeepSeek-V4 FP8 (FlashMLA MODEL1_FP8Sparse). One page of bs tokens:
//
//   [t*576,          t*576 + 448)   448 x e4m3 NoPE values of token t
//   [t*576 + 448,    t*576 + 576)   64 x bf16 RoPE values of token t
//   [bs*576 + t*8,   bs*576 + t*8+7) 7 x UE8M0 scales (tile k covers NoPE dims 64k..64k+63)
//   bs*576 + t*8 + 7                 pad byte, written 0
//   [bs*584, page_bytes(bs))         padding to a multiple of 576 bytes
//
// Head dim 512 = 448 NoPE + 64 RoPE; the value is the whole 512-vector.
struct V4Fp8Format {
  static constexpr KvFormat kFormat = KvFormat::kV4Fp8;
  static constexpr std::string_view kName = "v4-fp8";
  static constexpr int kHeadDim = 512;   // d_qk
  static constexpr int kValueDim = 512;  // d_v (RoPE dims included)
  static constexpr int kNopeDim = 448;
  static constexpr int kRopeDim = 64;
  static constexpr int kTile = 64;       // values per UE8M0 scale
  static constexpr int kNumTiles = kNopeDim / kTile;
  static constexpr int kDataBytes = kNopeDim + 2 * kRopeDim;  // 576, e4m3 NoPE + bf16 RoPE
  static constexpr int kScaleBytes = kNumTiles + 1;           // 7 scales + pad
  static constexpr int kBytesPerToken = kDataBytes + kScaleBytes;  // 584
  static constexpr int kPageAlign = 576;
  static constexpr bool kTokenContiguous = false;
  static constexpr KvRowLayout kLayout = KvRowLayout::kTiledNopeRope;
  static constexpr DType kStorage = DType::kU8;
  static constexpr int kRowElements = kBytesPerToken;  // last dim of the cache tensor
  static constexpr bool kPerTensorScale = false;
  static constexpr int kScaleBytesPerTile = 1;

  // Tile `tile`'s scale from the token's scale bytes, and the bytes of exponent e.
  SMLA_HOST_DEVICE static float tile_scale(const std::uint8_t* scales, int tile) { return ue8m0_to_f32(scales[tile]); }
  SMLA_HOST_DEVICE static void store_tile_scale(std::uint8_t* scales, int tile, int e) {
    scales[tile] = ue8m0_from_exponent(e);
  }

  static constexpr std::int64_t nope_offset(std::int64_t t, std::int64_t /*page_size*/) { return t * kDataBytes; }
  static constexpr std::int64_t rope_offset(std::int64_t t, std::int64_t /*page_size*/) {
    return t * kDataBytes + kNopeDim;
  }
  static constexpr std::int64_t scale_offset(std::int64_t t, std::int64_t page_size) {
    return page_size * kDataBytes + t * kScaleBytes;
  }
  // Bytes a page of page_size tokens occupies before alignment padding.
  static constexpr std::int64_t page_content_bytes(std::int64_t page_size) { return page_size * kBytesPerToken; }
  // Production page size: content rounded up to a multiple of 576 bytes.
  static constexpr std::int64_t page_bytes(std::int64_t page_size) {
    return (page_content_bytes(page_size) + kPageAlign - 1) / kPageAlign * kPageAlign;
  }
};
static_assert(V4Fp8Format::kNumTiles == 7 && V4Fp8Format::kBytesPerToken == 584);
static_assert(V4Fp8Format::page_bytes(64) == 37440 && V4Fp8Format::page_bytes(2) == 1728);

// ---------------------------------------------------------------------------
// DeepSeek-V3.2 FP8, token-contiguous 656 B per token:
//
//   [0, 512)    512 x e4m3 NoPE latent
//   [512, 528)  4 x f32 scales, one per 128 values (powers of two)
//   [528, 656)  64 x bf16 RoPE
//
// Head dim 576 = 512 + 64; the value is the 512 NoPE dims only.
struct V32Fp8Format {
  static constexpr KvFormat kFormat = KvFormat::kV32Fp8;
  static constexpr std::string_view kName = "v32-fp8";
  static constexpr int kHeadDim = 576;
  static constexpr int kValueDim = 512;
  static constexpr int kNopeDim = 512;
  static constexpr int kRopeDim = 64;
  static constexpr int kTile = 128;
  static constexpr int kNumTiles = kNopeDim / kTile;
  static constexpr int kScaleBytes = kNumTiles * 4;
  static constexpr int kBytesPerToken = kNopeDim + kScaleBytes + 2 * kRopeDim;  // 656
  static constexpr int kPageAlign = 1;
  static constexpr bool kTokenContiguous = true;
  static constexpr KvRowLayout kLayout = KvRowLayout::kTiledNopeRope;
  static constexpr DType kStorage = DType::kU8;
  static constexpr int kRowElements = kBytesPerToken;
  static constexpr bool kPerTensorScale = false;
  static constexpr int kScaleBytesPerTile = 4;

  SMLA_HOST_DEVICE static float tile_scale(const std::uint8_t* scales, int tile) {
    float scale;
    std::memcpy(&scale, scales + 4 * tile, 4);
    return scale;
  }
  SMLA_HOST_DEVICE static void store_tile_scale(std::uint8_t* scales, int tile, int e) {
    const float scale = std::ldexp(1.0f, e);
    std::memcpy(scales + 4 * tile, &scale, 4);
  }

  static constexpr std::int64_t nope_offset(std::int64_t t, std::int64_t) { return t * kBytesPerToken; }
  static constexpr std::int64_t scale_offset(std::int64_t t, std::int64_t) { return t * kBytesPerToken + kNopeDim; }
  static constexpr std::int64_t rope_offset(std::int64_t t, std::int64_t) {
    return t * kBytesPerToken + kNopeDim + kScaleBytes;
  }
  static constexpr std::int64_t page_content_bytes(std::int64_t page_size) { return page_size * kBytesPerToken; }
  static constexpr std::int64_t page_bytes(std::int64_t page_size) { return page_content_bytes(page_size); }
};
static_assert(V32Fp8Format::kBytesPerToken == 656 && V32Fp8Format::kNumTiles == 4);

// ---------------------------------------------------------------------------
// Plain rows: each token is the full rotated 512-vector in the element type.
struct Bf16RowsFormat {
  static constexpr KvFormat kFormat = KvFormat::kBf16Rows;
  static constexpr std::string_view kName = "bf16-rows";
  static constexpr int kHeadDim = 512;
  static constexpr int kValueDim = 512;
  static constexpr int kElementBytes = 2;
  static constexpr int kBytesPerToken = kHeadDim * kElementBytes;
  static constexpr KvRowLayout kLayout = KvRowLayout::kPlainRows;
  static constexpr DType kStorage = DType::kBF16;
  static constexpr int kRowElements = kHeadDim;
  static constexpr bool kPerTensorScale = false;
  static constexpr std::int64_t page_content_bytes(std::int64_t page_size) { return page_size * kBytesPerToken; }
  static constexpr std::int64_t page_bytes(std::int64_t page_size) { return page_content_bytes(page_size); }
};

struct Fp8RowsFormat {  // value = e4m3 * per-tensor scale
  static constexpr KvFormat kFormat = KvFormat::kFp8Rows;
  static constexpr std::string_view kName = "fp8-rows";
  static constexpr int kHeadDim = 512;
  static constexpr int kValueDim = 512;
  static constexpr int kElementBytes = 1;
  static constexpr int kBytesPerToken = kHeadDim * kElementBytes;
  static constexpr KvRowLayout kLayout = KvRowLayout::kPlainRows;
  static constexpr DType kStorage = DType::kE4M3;
  static constexpr int kRowElements = kHeadDim;
  static constexpr bool kPerTensorScale = true;  // KvCacheView::fp8_scale
  static constexpr std::int64_t page_content_bytes(std::int64_t page_size) { return page_size * kBytesPerToken; }
  static constexpr std::int64_t page_bytes(std::int64_t page_size) { return page_content_bytes(page_size); }
};

// ---------------------------------------------------------------------------
// THE list of formats, in KvFormat order. Everything that enumerates formats is
// derived from it: visit_kv_format, kv_format_info, parse_kv_format, the CPU
// kernel, the CUDA kernel variants (src/cuda/CMakeLists.txt reads this line and
// compiles one translation unit per entry), the CLI's tables and the manifests.
template <class... Formats>
struct KvFormatList {
  static constexpr int kSize = sizeof...(Formats);
};
using KvFormats = KvFormatList<V4Fp8Format, V32Fp8Format, Bf16RowsFormat, Fp8RowsFormat>;

namespace kv_format_detail {
template <class... Formats>
constexpr bool in_enum_order(KvFormatList<Formats...>) {
  int index = 0;
  return ((static_cast<int>(Formats::kFormat) == index++) && ...);
}
template <class... Formats>
constexpr std::array<KvFormat, sizeof...(Formats)> values(KvFormatList<Formats...>) {
  return {Formats::kFormat...};
}
template <class Fn, class First, class... Rest>
decltype(auto) visit(KvFormat format, Fn& fn, KvFormatList<First, Rest...>) {
  if constexpr (sizeof...(Rest) == 0) {
    return fn(First{});
  } else {
    if (format == First::kFormat) return fn(First{});
    return visit(format, fn, KvFormatList<Rest...>{});
  }
}
template <class Fn, class... Formats>
void for_each(Fn& fn, KvFormatList<Formats...>) {
  (fn(Formats{}), ...);
}
}  // namespace kv_format_detail
static_assert(kv_format_detail::in_enum_order(KvFormats{}), "KvFormats lists the formats in KvFormat order");

// Every format value, in KvFormat order.
inline constexpr auto kAllKvFormats = kv_format_detail::values(KvFormats{});

// Calls fn(FormatTraits{}) with the traits type of a runtime format value.
template <class Fn>
decltype(auto) visit_kv_format(KvFormat format, Fn&& fn) {
  return kv_format_detail::visit(format, fn, KvFormats{});
}

// Calls fn(FormatTraits{}) for every format, in KvFormat order.
template <class Fn>
void for_each_kv_format(Fn&& fn) {
  kv_format_detail::for_each(fn, KvFormats{});
}

// Runtime summary of a format, derived from its traits.
struct KvFormatInfo {
  KvFormat format;
  std::string_view name;
  int head_dim;
  int value_dim;
  int bytes_per_token;
  DType storage_dtype;  // dtype of the cache tensor: u8, bf16 or e4m3
  int row_elements;     // last dimension of the cache tensor
  KvRowLayout layout;
  bool per_tensor_scale;  // reads KvCacheView::fp8_scale
};
KvFormatInfo kv_format_info(KvFormat format);
Expected<KvFormat> parse_kv_format(std::string_view name);  // "v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows"
std::string_view kv_format_name(KvFormat format);
// Every format's name, joined by `separator`: "v4-fp8, v32-fp8, bf16-rows, fp8-rows".
std::string kv_format_names(std::string_view separator = ", ");

// A paged cache. pages: V4/V3.2: u8 [num_pages, page_size, bytes_per_token];
// bf16 rows: bf16 [num_pages, page_size, 512]; fp8 rows: e4m3 [num_pages, page_size, 512].
// Slot s addresses page s / page_size, entry s % page_size.
struct KvCacheView {
  TensorView pages;
  KvFormat format = KvFormat::kV4Fp8;
  float fp8_scale = 1.0f;  // formats with kPerTensorScale (fp8-rows) only

  std::int64_t num_pages() const { return pages.shape[0]; }
  std::int64_t page_size() const { return pages.shape[1]; }
  std::int64_t num_slots() const { return pages.shape[0] * pages.shape[1]; }
  std::int64_t page_stride_bytes() const;  // stride[0] in bytes
};

// Checks the cache tensor against its format: rank 3, dtype, row size, row
// stride, page stride large enough for the page contents. `name` prefixes errors.
Status validate_kv_cache(const KvCacheView& cache, std::string_view name);

}  // namespace smla
