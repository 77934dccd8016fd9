// Internal: encode/decode one token row of a paged cache, for every row layout
// (KvRowLayout; the traits give the offsets and the scale encoding).
// Shared by the codecs, the reference, the CPU backend and (host-device) the
// CUDA kernels, so the byte layout is interpreted in exactly one place.
#pragma once

#include <cstdint>
#include <cstring>

#include "smla/kv_format.h"
#include "smla/numeric.h"

namespace smla::detail {

SMLA_HOST_DEVICE bool is_finite_f32(float x) { return (f32_bits(x) & 0x7F800000u) != 0x7F800000u; }

SMLA_HOST_DEVICE std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
SMLA_HOST_DEVICE void store_u16(std::uint8_t* p, std::uint16_t v) { std::memcpy(p, &v, 2); }

// Quantizes `count` values that are already bf16-representable with one
// power-of-two scale (the production rule, kv_format.h). Returns the exponent.
SMLA_HOST_DEVICE int quantize_tile(const float* x, int count, std::uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    if (is_finite_f32(a) && a > amax) amax = a;
  }
  const int e = fp8_tile_exponent(amax);
  for (int i = 0; i < count; ++i) codes[i] = f32_to_e4m3(std::ldexp(x[i], -e));
  return e;
}

// Values decode in units of 8 (a 16-byte bf16 store on the GPU): every format's
// dims, tiles and NoPE / RoPE boundary are multiples of it.
inline constexpr int kDecodeUnit = 8;

// Decodes values [8 unit, 8 unit + 8) of token t of `page` (the page's first byte) into out[8].
template <class Format>
SMLA_HOST_DEVICE void decode_unit(const std::uint8_t* page, std::int64_t page_size, std::int64_t t, float fp8_scale,
                                  int unit, float* out) {
  static_assert(Format::kHeadDim % kDecodeUnit == 0);
  const int first = unit * kDecodeUnit;
  if constexpr (Format::kLayout == KvRowLayout::kTiledNopeRope) {
    static_assert(Format::kTile % kDecodeUnit == 0 && Format::kNopeDim % kDecodeUnit == 0);
    if (first < Format::kNopeDim) {
      const std::uint8_t* nope = page + Format::nope_offset(t, page_size);
      const float scale = Format::tile_scale(page + Format::scale_offset(t, page_size), first / Format::kTile);
      for (int i = 0; i < kDecodeUnit; ++i) out[i] = e4m3_to_f32(nope[first + i]) * scale;
    } else {
      const std::uint8_t* rope = page + Format::rope_offset(t, page_size) + 2 * (first - Format::kNopeDim);
      for (int i = 0; i < kDecodeUnit; ++i) out[i] = bf16_to_f32(load_u16(rope + 2 * i));
    }
  } else if constexpr (Format::kStorage == DType::kBF16) {
    static_assert(Format::kLayout == KvRowLayout::kPlainRows);
    const std::uint8_t* row = page + t * Format::kBytesPerToken + 2 * first;
    for (int i = 0; i < kDecodeUnit; ++i) out[i] = bf16_to_f32(load_u16(row + 2 * i));
  } else {
    static_assert(Format::kLayout == KvRowLayout::kPlainRows && Format::kStorage == DType::kE4M3 &&
                  Format::kPerTensorScale);
    const std::uint8_t* row = page + t * Format::kBytesPerToken + first;
    for (int i = 0; i < kDecodeUnit; ++i) out[i] = e4m3_to_f32(row[i]) * fp8_scale;
  }
}

// Decodes token t of `page` into out[Format::kHeadDim].
template <class Format>
SMLA_HOST_DEVICE void decode_token(const std::uint8_t* page, std::int64_t page_size, std::int64_t t, float fp8_scale,
                                   float* out) {
  for (int unit = 0; unit < Format::kHeadDim / kDecodeUnit; ++unit) {
    decode_unit<Format>(page, page_size, t, fp8_scale, unit, out + unit * kDecodeUnit);
  }
}

// Encodes row[Format::kHeadDim] (any f32; rounded to bf16 first, as the
// production writers do) as token t of `page`.
template <class Format>
SMLA_HOST_DEVICE void encode_token(const float* row, std::uint8_t* page, std::int64_t page_size, std::int64_t t,
                                   float fp8_scale) {
  if constexpr (Format::kLayout == KvRowLayout::kTiledNopeRope) {
    std::uint8_t* nope = page + Format::nope_offset(t, page_size);
    std::uint8_t* scales = page + Format::scale_offset(t, page_size);
    std::uint8_t* rope = page + Format::rope_offset(t, page_size);
    float tile_values[Format::kTile];
    for (int tile = 0; tile < Format::kNumTiles; ++tile) {
      for (int i = 0; i < Format::kTile; ++i) tile_values[i] = round_to_bf16(row[tile * Format::kTile + i]);
      const int e = quantize_tile(tile_values, Format::kTile, nope + tile * Format::kTile);
      Format::store_tile_scale(scales, tile, e);
    }
    // Pad bytes after the scales (V4's eighth byte) are written 0.
    for (int i = Format::kNumTiles * Format::kScaleBytesPerTile; i < Format::kScaleBytes; ++i) scales[i] = 0;
    for (int i = 0; i < Format::kRopeDim; ++i) store_u16(rope + 2 * i, f32_to_bf16(row[Format::kNopeDim + i]));
  } else if constexpr (Format::kStorage == DType::kBF16) {
    std::uint8_t* out = page + t * Format::kBytesPerToken;
    for (int i = 0; i < Format::kHeadDim; ++i) store_u16(out + 2 * i, f32_to_bf16(row[i]));
  } else {
    std::uint8_t* out = page + t * Format::kBytesPerToken;
    for (int i = 0; i < Format::kHeadDim; ++i) out[i] = f32_to_e4m3(round_to_bf16(row[i]) / fp8_scale);
  }
}

// Byte address of the page holding `slot` and the entry inside it. The caller
// has checked 0 <= slot < cache.num_slots().
inline std::uint8_t* writable_page_of_slot(const KvCacheView& cache, std::int64_t slot, std::int64_t* entry) {
  const std::int64_t page = slot / cache.page_size();
  *entry = slot % cache.page_size();
  return static_cast<std::uint8_t*>(cache.pages.data) + page * cache.page_stride_bytes();
}
inline const std::uint8_t* page_of_slot(const KvCacheView& cache, std::int64_t slot, std::int64_t* entry) {
  return writable_page_of_slot(cache, slot, entry);
}

}  // namespace smla::detail
