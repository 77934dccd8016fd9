// Device row loaders: how one KV token is copied raw into shared memory
// (cp.async, kParts threads per token; the attention kernel uses 8) and then
// expanded to a bf16 K row. Every byte offset comes from the format traits in include/smla/kv_format.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "smla/kv_format.h"
#include "src/cuda/common/ptx.cuh"
#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda {

constexpr int round_up_16(int bytes) { return (bytes + 15) / 16 * 16; }

__device__ __forceinline__ const std::uint8_t* page_base(const KvSourceParams& src, std::uint32_t slot,
                                                         std::uint32_t* entry) {
  const std::uint32_t page_size = static_cast<std::uint32_t>(src.page_size);
  const std::uint32_t page = slot / page_size;
  *entry = slot - page * page_size;
  return src.pages + static_cast<std::int64_t>(page) * src.page_stride_bytes;
}

// A plain-row source's row of `slot` (rows row_stride_bytes apart within a page).
__device__ __forceinline__ const std::uint8_t* plain_row(const KvSourceParams& src, std::uint32_t slot) {
  std::uint32_t entry = 0;
  const std::uint8_t* page = page_base(src, slot, &entry);
  return page + static_cast<std::int64_t>(entry) * src.row_stride_bytes;
}

// The first kBytes (a multiple of 16) of `row` into `raw`, 16 bytes a cp.async:
// chunks part, part + kParts, ... of a key's kParts threads.
template <int kBytes, int kParts>
__device__ __forceinline__ void copy_row_async(std::uint8_t* raw, const std::uint8_t* row, int part) {
  static_assert(kBytes % 16 == 0);
  for (int chunk = part; chunk < kBytes / 16; chunk += kParts) cp_async_16(raw + 16 * chunk, row + 16 * chunk);
}

// The issue step of the loaders of plain rows (kBytes each, row_stride_bytes apart in a page).
template <int kBytes>
struct PlainRowIssue {
  template <int kParts>
  __device__ static void issue(std::uint8_t* raw, const KvSourceParams& src, std::uint32_t slot, int part) {
    copy_row_async<kBytes, kParts>(raw, plain_row(src, slot), part);
  }
};

// Four e4m3 codes (one 32-bit word) as f32 pairs: exact (every e4m3 value is an f16 normal).
__device__ __forceinline__ void e4m3x4_to_f32(std::uint32_t codes, float2* lo, float2* hi) {
  const auto low_pair = static_cast<__nv_fp8x2_storage_t>(codes & 0xFFFFu);
  const auto high_pair = static_cast<__nv_fp8x2_storage_t>(codes >> 16);
  *lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(low_pair, __NV_E4M3)));
  *hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(high_pair, __NV_E4M3)));
}

__device__ __forceinline__ uint2 bf16x2_pair_bits(__nv_bfloat162 a, __nv_bfloat162 b) {
  return make_uint2(*reinterpret_cast<const std::uint32_t*>(&a), *reinterpret_cast<const std::uint32_t*>(&b));
}

// Four e4m3 codes (one 32-bit word) times a scale, to four bf16 values.
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(std::uint32_t codes, float scale) {
  float2 lo, hi;
  e4m3x4_to_f32(codes, &lo, &hi);
  return bf16x2_pair_bits(__floats2bfloat162_rn(lo.x * scale, lo.y * scale),
                          __floats2bfloat162_rn(hi.x * scale, hi.y * scale));
}

// The same with a power-of-two scale held as bf16x2 (a UE8M0 scale): the codes
// become bf16 first (every e4m3 value is a bf16 normal) and one bf16x2 multiply
// applies the scale. Bit for bit the f32 route: both round the exact product
// once, subnormal results included (mul.bf16x2 has no flush-to-zero); NaN stays NaN.
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(std::uint32_t codes, __nv_bfloat162 scale) {
  float2 lo, hi;
  e4m3x4_to_f32(codes, &lo, &hi);
  return bf16x2_pair_bits(__hmul2(__floats2bfloat162_rn(lo.x, lo.y), scale),
                          __hmul2(__floats2bfloat162_rn(hi.x, hi.y), scale));
}

// 16 e4m3 codes times a scale to 16 bf16 values (values 0-7 in `low`, 8-15 in `high`).
template <class Scale>
__device__ __forceinline__ void expand_unit_by(const uint4& codes, Scale scale, uint4* low, uint4* high) {
  const uint2 a = e4m3x4_to_bf16x4(codes.x, scale);
  const uint2 b = e4m3x4_to_bf16x4(codes.y, scale);
  const uint2 c = e4m3x4_to_bf16x4(codes.z, scale);
  const uint2 d = e4m3x4_to_bf16x4(codes.w, scale);
  *low = make_uint4(a.x, a.y, b.x, b.y);
  *high = make_uint4(c.x, c.y, d.x, d.y);
}

// A UE8M0 scale byte as two bf16 copies of 2^(byte - 127), without branches:
// 0 is the bf16 subnormal 2^-127, 0xFF is NaN (as ue8m0_to_f32).
__device__ __forceinline__ __nv_bfloat162 ue8m0_to_bf16x2(std::uint32_t byte) {
  std::uint32_t bits = byte << 7;
  bits = byte == 0 ? 0x0040u : bits;
  bits = byte == 0xFFu ? 0x7FC0u : bits;
  bits *= 0x00010001u;
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}

// 8 e4m3 codes at `raw` (8-byte aligned, shared) -> 8 bf16 at `dst` (16-byte aligned, shared).
// The FP8 loaders hand a key's threads interleaved 8-value chunks (chunk = part + kParts j):
// each 8-thread phase then reads 64 consecutive raw bytes and writes 128 consecutive
// K-row bytes, free of bank conflicts. (Contiguous 64-value runs per thread put the
// 8 threads' 16-byte stores in one bank group: 8-way conflicts on every store.)
// Scale: float, or __nv_bfloat162 for a power of two (see e4m3x4_to_bf16x4).
template <class Scale>
__device__ __forceinline__ void dequant_8(const std::uint8_t* raw, __nv_bfloat16* dst, Scale scale) {
  const uint2 codes = *reinterpret_cast<const uint2*>(raw);
  const uint2 lo = e4m3x4_to_bf16x4(codes.x, scale);
  const uint2 hi = e4m3x4_to_bf16x4(codes.y, scale);
  *reinterpret_cast<uint4*>(dst) = make_uint4(lo.x, lo.y, hi.x, hi.y);
}

inline constexpr int kValuesPerChunk = 8;

// Calls body(chunk) for chunk = part, part + kParts, ... below kChunks, with a
// trip count known at compile time (part < kParts).
template <int kChunks, int kParts, class Body>
__device__ __forceinline__ void for_each_chunk(int part, Body&& body) {
#pragma unroll
  for (int j = 0; j < (kChunks + kParts - 1) / kParts; ++j) {
    const int chunk = part + j * kParts;
    if (kChunks % kParts == 0 || chunk < kChunks) body(chunk);
  }
}

// DeepSeek-V4 FP8: 448 e4m3 NoPE + 64 bf16 RoPE in the data row, 7 UE8M0 scales
// in the page's scale rows. Raw staging: data row, then the 8 scale bytes.
struct V4Fp8Loader {
  using Format = V4Fp8Format;
  static constexpr int kHeadDim = Format::kHeadDim;
  static constexpr int kScaleStage = Format::kDataBytes;  // where the scale bytes land in the staging row
  static constexpr int kRawStride = round_up_16(Format::kDataBytes + Format::kScaleBytes);
  static_assert(Format::kDataBytes % 16 == 0 && Format::kScaleBytes == 8);
  static_assert(Format::kNopeDim % kValuesPerChunk == 0 && Format::kTile % kValuesPerChunk == 0);
  static_assert(Format::kRopeDim * 2 % 16 == 0);

  template <int kParts>
  __device__ static void issue(std::uint8_t* raw, const KvSourceParams& src, std::uint32_t slot, int part) {
    std::uint32_t entry = 0;
    const std::uint8_t* page = page_base(src, slot, &entry);
    copy_row_async<Format::kDataBytes, kParts>(raw, page + Format::nope_offset(entry, src.page_size), part);
    if (part == kParts - 1) cp_async_8(raw + kScaleStage, page + Format::scale_offset(entry, src.page_size));
  }

  template <int kParts>
  __device__ static void dequant(const std::uint8_t* raw, __nv_bfloat16* krow, int part, float /*fp8_scale*/) {
    for_each_chunk<Format::kNopeDim / kValuesPerChunk, kParts>(part, [&](int chunk) {
      const int first = chunk * kValuesPerChunk;
      dequant_8(raw + first, krow + first, ue8m0_to_bf16x2(raw[kScaleStage + first / Format::kTile]));
    });
    for_each_chunk<Format::kRopeDim * 2 / 16, kParts>(part, [&](int chunk) {
      reinterpret_cast<uint4*>(krow + Format::kNopeDim)[chunk] =
          reinterpret_cast<const uint4*>(raw + Format::rope_offset(0, 0))[chunk];
    });
  }
};

// DeepSeek-V3.2 FP8: token-contiguous 512 e4m3 + 4 f32 scales + 64 bf16 RoPE.
struct V32Fp8Loader {
  using Format = V32Fp8Format;
  static constexpr int kHeadDim = Format::kHeadDim;
  static constexpr int kRawStride = round_up_16(Format::kBytesPerToken);
  static_assert(Format::kBytesPerToken % 16 == 0 && Format::kTile % kValuesPerChunk == 0);
  static_assert(Format::kNopeDim % kValuesPerChunk == 0 && Format::kRopeDim * 2 % 16 == 0);

  template <int kParts>
  __device__ static void issue(std::uint8_t* raw, const KvSourceParams& src, std::uint32_t slot, int part) {
    std::uint32_t entry = 0;
    const std::uint8_t* row = page_base(src, slot, &entry) + Format::nope_offset(entry, src.page_size);
    copy_row_async<Format::kBytesPerToken, kParts>(raw, row, part);
  }

  template <int kParts>
  __device__ static void dequant(const std::uint8_t* raw, __nv_bfloat16* krow, int part, float /*fp8_scale*/) {
    const float* scales = reinterpret_cast<const float*>(raw + Format::scale_offset(0, 0));
    for_each_chunk<Format::kNopeDim / kValuesPerChunk, kParts>(part, [&](int chunk) {
      const int first = chunk * kValuesPerChunk;
      dequant_8(raw + first, krow + first, scales[first / Format::kTile]);
    });
    const int rope_at = static_cast<int>(Format::rope_offset(0, 0));
    for_each_chunk<Format::kRopeDim * 2 / 16, kParts>(part, [&](int chunk) {
      reinterpret_cast<uint4*>(krow + Format::kNopeDim)[chunk] = reinterpret_cast<const uint4*>(raw + rope_at)[chunk];
    });
  }
};

// Plain bf16 rows of kDim values (the bf16 paged format, and the flat prefill
// workspace viewed as one page with its own row stride).
template <int kDim>
struct Bf16RowLoader : PlainRowIssue<kDim * 2> {
  static constexpr int kHeadDim = kDim;
  static constexpr int kRawStride = kDim * 2;

  template <int kParts>
  __device__ static void dequant(const std::uint8_t* raw, __nv_bfloat16* krow, int part, float /*fp8_scale*/) {
    const uint4* src = reinterpret_cast<const uint4*>(raw);
    uint4* dst = reinterpret_cast<uint4*>(krow);
    for_each_chunk<kRawStride / 16, kParts>(part, [&](int chunk) { dst[chunk] = src[chunk]; });
  }
};

// Plain e4m3 rows of 512 values with one per-tensor scale.
struct Fp8RowLoader : PlainRowIssue<Fp8RowsFormat::kBytesPerToken> {
  using Format = Fp8RowsFormat;
  static constexpr int kHeadDim = Format::kHeadDim;
  static constexpr int kRawStride = Format::kBytesPerToken;
  static_assert(Format::kHeadDim % kValuesPerChunk == 0);

  template <int kParts>
  __device__ static void dequant(const std::uint8_t* raw, __nv_bfloat16* krow, int part, float fp8_scale) {
    for_each_chunk<Format::kHeadDim / kValuesPerChunk, kParts>(part, [&](int chunk) {
      const int first = chunk * kValuesPerChunk;
      dequant_8(raw + first, krow + first, fp8_scale);
    });
  }
};

// The device code of a row source (an entry of KernelRows, sparse_attention_launch.h)
// in a kernel family, which supplies one type per kind of row: V4, V3.2, plain
// e4m3 rows with a per-tensor scale, and plain bf16 rows of any width.
template <class Rows, class V4, class V32, class Fp8Rows, template <int> class Bf16Rows>
constexpr auto row_code_of() {
  if constexpr (std::is_same_v<Rows, V4Fp8Format>) {
    return std::type_identity<V4>{};
  } else if constexpr (std::is_same_v<Rows, V32Fp8Format>) {
    return std::type_identity<V32>{};
  } else if constexpr (std::is_same_v<Rows, Fp8RowsFormat>) {
    return std::type_identity<Fp8Rows>{};
  } else {
    static_assert(Rows::kLayout == KvRowLayout::kPlainRows && Rows::kStorage == DType::kBF16,
                  "a row source without device code: add its kind here");
    return std::type_identity<Bf16Rows<Rows::kHeadDim>>{};
  }
}

// The portable kernel's loader of a row source.
template <class Rows>
using LoaderOf = typename decltype(row_code_of<Rows, V4Fp8Loader, V32Fp8Loader, Fp8RowLoader, Bf16RowLoader>())::type;

}  // namespace smla::cuda
