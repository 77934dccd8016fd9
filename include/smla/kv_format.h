// KV-cache formats. Each format is described exactly once, by a constexpr
// traits type below; codecs, kernels, tests and the CLI read these
// descriptions instead of repeating byte counts.
//
// A cache is a TensorView of pages: [num_pages, page_size, row] where the
// page stride (stride[0]) is taken from the tensor and never recomputed, so
// pages may be padded or interleaved with other layers' pages.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "smla/numeric.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

enum class KvFormat : std::uint8_t {
  kV4Fp8,     // DeepSeek-V4 "MODEL1" fp8_ds_mla: 584 B/token, data rows then scale rows per page
  kV32Fp8,    // DeepSeek-V3.2 fp8_ds_mla: 656 B/token, token-contiguous
  kBf16Rows,  // plain bf16 rows [page_size, 512]
  kFp8Rows,   // plain e4m3 rows [page_size, 512] with one per-tensor f32 scale
};

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
  static constexpr std::int64_t page_content_bytes(std::int64_t page_size) { return page_size * kBytesPerToken; }
  static constexpr std::int64_t page_bytes(std::int64_t page_size) { return page_content_bytes(page_size); }
};

// Calls fn(FormatTraits{}) with the traits type of a runtime format value.
template <class Fn>
decltype(auto) visit_kv_format(KvFormat format, Fn&& fn) {
  switch (format) {
    case KvFormat::kV4Fp8: return fn(V4Fp8Format{});
    case KvFormat::kV32Fp8: return fn(V32Fp8Format{});
    case KvFormat::kBf16Rows: return fn(Bf16RowsFormat{});
    case KvFormat::kFp8Rows: break;
  }
  return fn(Fp8RowsFormat{});
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
};
KvFormatInfo kv_format_info(KvFormat format);
Expected<KvFormat> parse_kv_format(std::string_view name);  // "v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows"
std::string_view kv_format_name(KvFormat format);

// A paged cache. pages: V4/V3.2: u8 [num_pages, page_size, bytes_per_token];
// bf16 rows: bf16 [num_pages, page_size, 512]; fp8 rows: e4m3 [num_pages, page_size, 512].
// Slot s addresses page s / page_size, entry s % page_size.
struct KvCacheView {
  TensorView pages;
  KvFormat format = KvFormat::kV4Fp8;
  float fp8_scale = 1.0f;  // kFp8Rows only

  std::int64_t num_pages() const { return pages.shape[0]; }
  std::int64_t page_size() const { return pages.shape[1]; }
  std::int64_t num_slots() const { return pages.shape[0] * pages.shape[1]; }
  std::int64_t page_stride_bytes() const;  // stride[0] in bytes
};

// Checks the cache tensor against its format: rank 3, dtype, row size, row
// stride, page stride large enough for the page contents. `name` prefixes errors.
Status validate_kv_cache(const KvCacheView& cache, std::string_view name);

// ---------------------------------------------------------------------------
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

}  // namespace smla
