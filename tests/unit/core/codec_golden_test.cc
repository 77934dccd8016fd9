// Golden bytes: rows chosen by hand, every stored byte worked out by hand in
// the comments from the rules of spec 2.2 - 2.4 (production rule
// e = ceil(log2(max(amax, 1e-4) / 448)), e4m3 RNE with saturation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "smla/codec.h"
#include "tests/unit/core/codec_test_util.h"

namespace smla::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Writes `row` to `slot` of `cache`, then checks every byte of the cache:
// `record` bytes at the slot's positions (V4: data row + scale row), canary
// everywhere else (other tokens, page padding, gaps between pages, tail).
template <class FORMAT>
void expect_single_record(PagedCache& cache, std::int64_t slot, const std::vector<float>& row,
                          const std::vector<std::uint8_t>& record) {
  ASSERT_EQ(record.size(), static_cast<std::size_t>(FORMAT::kBytesPerToken));
  std::vector<float> rows = row;
  const TensorView rows_view = TensorView::contiguous(rows.data(), DType::kF32, {1, FORMAT::kHeadDim});
  std::vector<std::int64_t> slots = {slot};
  const TensorView slots_view = TensorView::contiguous(slots.data(), DType::kI64, {1});
  const Status status = quantize_into_cache(cache.view, rows_view, slots_view);
  ASSERT_TRUE(status.ok()) << status.to_string();

  std::vector<std::uint8_t> expected(cache.bytes.size(), kCanary);
  place_reference_record<FORMAT>(expected, cache, slot, record);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(cache.bytes[i], expected[i]) << "byte " << i << " of the cache";
  }
}

// Little-endian bytes of a bf16 value given by its bits.
void put_bf16(std::vector<std::uint8_t>& record, int at, std::uint16_t bits) {
  record[static_cast<std::size_t>(at)] = static_cast<std::uint8_t>(bits & 0xFF);
  record[static_cast<std::size_t>(at) + 1] = static_cast<std::uint8_t>(bits >> 8);
}

// The V4 row shared by the encode and decode golden tests.
std::vector<float> v4_golden_row() {
  std::vector<float> x(512, 0.0f);
  // Tile 0 (dims 0..63): all zero.
  // Tile 1 (64..127): small amax.
  x[64] = 0.01f;
  x[65] = -std::ldexp(1.0f, -10);
  x[66] = std::ldexp(1.0f, -20);
  x[67] = std::ldexp(1.0f, -23);
  x[68] = std::ldexp(3.0f, -25);
  x[69] = std::ldexp(1.0f, -26);
  x[70] = -std::ldexp(5.0f, -25);
  // Tile 2 (128..191): amax exactly 448 * 2^3.
  x[128] = 3584.0f;
  x[129] = -3584.0f;
  x[130] = 1.0f;
  x[131] = -1.0f;
  // Tile 3 (192..255): amax exactly 448 * 2^-2.
  x[192] = 112.0f;
  x[193] = 100.0f;
  // Tile 4 (256..319): non-finite values next to a finite amax of 2.
  x[256] = kNaN;
  x[257] = kInf;
  x[258] = -kInf;
  x[259] = 2.0f;
  x[260] = std::copysign(kNaN, -1.0f);
  // Tile 5 (320..383): amax 336.
  x[320] = 336.0f;
  x[321] = -0.0f;
  // Tile 6 (384..447): amax just above 448.
  x[384] = 450.0f;
  x[385] = 449.0f;
  // RoPE (448..511), stored as bf16.
  x[448] = 1.0f;
  x[449] = -2.0f;
  x[450] = 3.14159274f;
  x[451] = 1.0f + std::ldexp(1.0f, -8);
  x[452] = kInf;
  x[453] = kNaN;
  return x;
}

TEST(CodecGolden, V4FormatBytes) {
  // 2 pages of 3 tokens; content 3 * 584 = 1752 B, page stride 2400 B leaves
  // 648 canary bytes after each page. Slot 4 = page 1, entry 1.
  PagedCache cache(KvFormat::kV4Fp8, 2, 3, 2400);
  std::vector<std::uint8_t> record(584, 0);  // [0,448) e4m3, [448,576) bf16 RoPE, [576,583) scales, 583 pad
  const std::map<int, std::uint8_t> nope_codes = {
      // Tile 1: bf16(0.01) = 1.28125 * 2^-7 = 41 * 2^-12 is the amax;
      // 41 * 2^-12 / 448 = 5.86 * 2^-18 -> e = ceil(-15.45) = -15.
      // 41 * 2^-12 * 2^15 = 328 lies between 320 and 352 (step 32): 320 = 1.25 * 2^8 -> E=15, M=2.
      {64, 0x7A},
      // -2^-10 * 2^15 = -32 = -1.0 * 2^5 -> sign, E=12, M=0.
      {65, 0xE0},
      // 2^-20 * 2^15 = 2^-5 -> E=2, M=0.
      {66, 0x10},
      // 2^-23 * 2^15 = 2^-8 = 2 * 2^-9: e4m3 subnormal, M=2.
      {67, 0x02},
      // 3 * 2^-25 * 2^15 = 1.5 * 2^-9: tie between subnormals 1 and 2 -> even 2.
      {68, 0x02},
      // 2^-26 * 2^15 = 0.25 * 2^-9 rounds to 0 (x[69] stays 0x00).
      // -5 * 2^-25 * 2^15 = -2.5 * 2^-9: tie between 2 and 3 -> even 2, sign set.
      {70, 0x82},
      // Tile 2: amax 3584 = 448 * 2^3 -> e = 3; 3584 * 2^-3 = 448 -> 0x7E; negative -> 0xFE.
      {128, 0x7E},
      {129, 0xFE},
      // 1.0 * 2^-3 -> E=4, M=0; negative sets the sign.
      {130, 0x20},
      {131, 0xA0},
      // Tile 3: amax 112 = 448 * 2^-2 -> e = -2; 112 * 4 = 448 -> 0x7E.
      {192, 0x7E},
      // 100 * 4 = 400 = 1.5625 * 2^8: tie between M=4 (384) and M=5 (416) -> even M=4.
      {193, 0x7C},
      // Tile 4: amax over finite values only = 2; 2 / 448 -> e = ceil(-7.81) = -7.
      // NaN -> 0x7F, +Inf -> +448 (0x7E), -Inf -> 0xFE, 2 * 2^7 = 256 -> E=15, M=0; -NaN -> 0xFF.
      {256, 0x7F},
      {257, 0x7E},
      {258, 0xFE},
      {259, 0x78},
      {260, 0xFF},
      // Tile 5: amax 336, 336 / 448 = 0.75 -> e = 0 (scale 1).
      // 336 = 1.3125 * 2^8: tie between M=2 (320) and M=3 (352) -> even M=2.
      {320, 0x7A},
      // -0.0 keeps its sign.
      {321, 0x80},
      // Tile 6: bf16(450) = 450 (1.7578125 * 2^8), 450 / 448 > 1 -> e = 1.
      // 450 / 2 = 225 = 1.7578125 * 2^7 -> M = round(6.06) = 6 (224) -> E=14, M=6.
      {384, 0x76},
      // bf16(449): 449 = 1.75390625 * 2^8 is a tie between 448 and 450 -> even 448, so 224 -> 0x76.
      {385, 0x76},
  };
  for (const auto& [dim, code] : nope_codes) record[static_cast<std::size_t>(dim)] = code;
  // RoPE, little-endian bf16 at 448 + 2 * (dim - 448).
  put_bf16(record, 448, 0x3F80);  // 1.0
  put_bf16(record, 450, 0xC000);  // -2.0
  put_bf16(record, 452, 0x4049);  // pi: 1.5708 * 2, mantissa 0.5708 * 128 = 73.06 -> 73 = 0x49
  put_bf16(record, 454, 0x3F80);  // 1 + 2^-8: tie between 1 and 1 + 2^-7 -> even 1.0
  put_bf16(record, 456, 0x7F80);  // +Inf passes through
  put_bf16(record, 458, 0x7FC0);  // NaN stays a (quiet) NaN
  // Scale bytes 127 + e: tile 0 all zero -> amax clamps to 1e-4 = 0.82 * 2^-13 -> e = -22 -> 105.
  const std::uint8_t scales[8] = {105, 127 - 15, 127 + 3, 127 - 2, 127 - 7, 127, 127 + 1, 0 /* pad */};
  for (int i = 0; i < 8; ++i) record[static_cast<std::size_t>(576 + i)] = scales[i];
  expect_single_record<V4Fp8Format>(cache, 4, v4_golden_row(), record);
}

TEST(CodecGolden, V4DecodesGoldenRow) {
  PagedCache cache(KvFormat::kV4Fp8, 1, 1, V4Fp8Format::page_bytes(1));
  std::vector<float> row = v4_golden_row();
  std::vector<std::int32_t> slots = {0, -1};
  std::vector<float> rows(2 * 512, 0.0f);
  std::copy(row.begin(), row.end(), rows.begin());
  ASSERT_TRUE(quantize_into_cache(cache.view, TensorView::contiguous(rows.data(), DType::kF32, {2, 512}),
                                  TensorView::contiguous(slots.data(), DType::kI32, {2}))
                  .ok());
  std::vector<float> out(2 * 512, 12345.0f);  // poisoned: every element must be written
  const Status status = gather_from_cache(cache.view, TensorView::contiguous(slots.data(), DType::kI32, {2}),
                                          TensorView::contiguous(out.data(), DType::kF32, {2, 512}));
  ASSERT_TRUE(status.ok()) << status.to_string();
  // Dequantized by hand: code value * 2^e (values from the comments of V4FormatBytes).
  std::vector<float> expected(512, 0.0f);
  expected[64] = 320.0f * std::ldexp(1.0f, -15);  // 0.009765625, vs 0.01 stored
  expected[65] = -std::ldexp(1.0f, -10);
  expected[66] = std::ldexp(1.0f, -20);
  expected[67] = std::ldexp(1.0f, -23);
  expected[68] = std::ldexp(1.0f, -23);
  expected[70] = -std::ldexp(1.0f, -23);
  expected[128] = 3584.0f;
  expected[129] = -3584.0f;
  expected[130] = 1.0f;
  expected[131] = -1.0f;
  expected[192] = 112.0f;
  expected[193] = 96.0f;  // 384 * 2^-2
  expected[256] = kNaN;
  expected[257] = 3.5f;  // 448 * 2^-7
  expected[258] = -3.5f;
  expected[259] = 2.0f;
  expected[260] = kNaN;
  expected[320] = 320.0f;
  expected[321] = -0.0f;
  expected[384] = 448.0f;  // 224 * 2
  expected[385] = 448.0f;
  expected[448] = 1.0f;
  expected[449] = -2.0f;
  expected[450] = 3.140625f;
  expected[451] = 1.0f;
  expected[452] = kInf;
  expected[453] = kNaN;
  for (int d = 0; d < 512; ++d) {
    if (std::isnan(expected[d])) {
      EXPECT_TRUE(std::isnan(out[d])) << "dim " << d;
    } else {
      EXPECT_EQ(out[d], expected[d]) << "dim " << d;
      EXPECT_EQ(std::signbit(out[d]), std::signbit(expected[d])) << "dim " << d;
    }
  }
  for (int d = 0; d < 512; ++d) ASSERT_EQ(out[512 + d], 0.0f) << "slot -1 must give a zero row, dim " << d;
}

TEST(CodecGolden, V4DecodesCachesWrittenWithTheCpuRule) {
  // The CPU/FlashMLA-reference writer picks e = ceil(log2(max(amax / 448, 1e-4))):
  // for amax bf16(0.01) = 41 * 2^-12 that is ceil(log2(1e-4)) = -13 (byte 114),
  // not the production -15. Its code: 41 * 2^-12 * 2^13 = 82 -> 80 = 1.25 * 2^6
  // -> E=13, M=2 = 0x6A. Decoding reads the stored scale: 80 * 2^-13.
  PagedCache cache(KvFormat::kV4Fp8, 1, 2, V4Fp8Format::page_bytes(2));
  std::fill(cache.bytes.begin(), cache.bytes.end(), 0);
  const std::int64_t token = 1;
  cache.bytes[static_cast<std::size_t>(token * 576 + 64)] = 0x6A;
  for (int tile = 0; tile < 7; ++tile) cache.bytes[static_cast<std::size_t>(2 * 576 + token * 8 + tile)] = 105;
  cache.bytes[static_cast<std::size_t>(2 * 576 + token * 8 + 1)] = 114;
  std::vector<std::int32_t> slots = {static_cast<std::int32_t>(token)};
  std::vector<std::uint16_t> out(512, 0x7FC1);  // bf16 NaN poison
  const Status status = gather_from_cache(cache.view, TensorView::contiguous(slots.data(), DType::kI32, {1}),
                                          TensorView::contiguous(out.data(), DType::kBF16, {1, 512}));
  ASSERT_TRUE(status.ok()) << status.to_string();
  for (int d = 0; d < 512; ++d) {
    // 0.009765625 = 1.25 * 2^-7: bf16 bits 0x3C20 (biased exponent 120, mantissa 0x20).
    EXPECT_EQ(out[static_cast<std::size_t>(d)], d == 64 ? 0x3C20 : 0x0000) << "dim " << d;
  }
}

TEST(CodecGolden, V32FormatBytes) {
  // 3 pages of 1 token, page stride 700 > 656; slot 2 = page 2.
  PagedCache cache(KvFormat::kV32Fp8, 3, 1, 700);
  std::vector<float> x(576, 0.0f);
  std::vector<std::uint8_t> record(656, 0);  // [0,512) e4m3, [512,528) 4 x f32 scale, [528,656) bf16 RoPE
  // Tile 0 (0..127): amax 336 -> e = 0, scale 1.0f = 0x3F800000.
  x[0] = 336.0f;
  record[0] = 0x7A;  // 336 = 1.3125 * 2^8 ties to M=2 (320)
  x[1] = 0.5f;
  record[1] = 0x30;  // 2^-1 -> E=6
  // Tile 1 (128..255): all zero -> e = -22, scale 2^-22 = 0x34800000 (biased exponent 105).
  // Tile 2 (256..383): amax bf16(0.01) -> e = -15, scale 2^-15 = 0x38000000; code 0x7A (see V4).
  x[256] = 0.01f;
  record[256] = 0x7A;
  // Tile 3 (384..511): amax 14336 = 448 * 2^5 -> e = 5, scale 32 = 0x42000000.
  x[384] = -14336.0f;
  record[384] = 0xFE;
  x[385] = 1.0f;
  record[385] = 0x10;  // 2^-5 -> E=2
  const std::uint8_t scale_bytes[16] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x80, 0x34,
                                        0x00, 0x00, 0x00, 0x38, 0x00, 0x00, 0x00, 0x42};
  for (int i = 0; i < 16; ++i) record[static_cast<std::size_t>(512 + i)] = scale_bytes[i];
  // RoPE dims 512..575 at bytes 528 + 2 * (dim - 512).
  x[512] = 1.0f;
  put_bf16(record, 528, 0x3F80);
  x[575] = -2.0f;
  put_bf16(record, 528 + 126, 0xC000);
  expect_single_record<V32Fp8Format>(cache, 2, x, record);
}

TEST(CodecGolden, Bf16RowsBytes) {
  PagedCache cache(KvFormat::kBf16Rows, 2, 2, 2 * 1024 + 6);  // 6 canary bytes between pages
  std::vector<float> x(512, 0.0f);
  std::vector<std::uint8_t> record(1024, 0);
  x[0] = 1.0f;
  put_bf16(record, 0, 0x3F80);
  x[1] = -2.0f;
  put_bf16(record, 2, 0xC000);
  x[2] = 3.14159274f;
  put_bf16(record, 4, 0x4049);
  x[3] = 1.0f + std::ldexp(1.0f, -8);  // tie -> even 1.0
  put_bf16(record, 6, 0x3F80);
  x[4] = 1.0f + std::ldexp(3.0f, -8);  // tie between 0x3F81 and 0x3F82 -> even 0x3F82
  put_bf16(record, 8, 0x3F82);
  x[5] = kInf;
  put_bf16(record, 10, 0x7F80);
  x[6] = -kInf;
  put_bf16(record, 12, 0xFF80);
  x[7] = kNaN;
  put_bf16(record, 14, 0x7FC0);
  // f32 subnormal 1e-40 = 71362 * 2^-149 = bits 0x000116C2: low half 0x16C2 < 0x8000 rounds down.
  x[511] = 1e-40f;
  put_bf16(record, 1022, 0x0001);
  expect_single_record<Bf16RowsFormat>(cache, 3, x, record);
}

TEST(CodecGolden, Fp8RowsBytes) {
  // Per-tensor scale 0.5: stored code = e4m3(bf16(x) / 0.5), value = code * 0.5.
  PagedCache cache(KvFormat::kFp8Rows, 3, 1, 512 + 1, 0.5f);
  std::vector<float> x(512, 0.0f);
  std::vector<std::uint8_t> record(512, 0);
  x[0] = 1.0f;
  record[0] = 0x40;  // 2.0 -> E=8
  x[1] = 300.0f;
  record[1] = 0x7E;  // 600 saturates to 448
  x[2] = kNaN;
  record[2] = 0x7F;
  x[3] = -kInf;
  record[3] = 0xFE;
  x[4] = std::ldexp(1.0f, -11);
  record[4] = 0x00;  // 2^-10 = 0.5 * 2^-9 ties to even 0
  x[5] = std::ldexp(3.0f, -11);
  record[5] = 0x02;  // 1.5 * 2^-9 ties to even 2
  // bf16(0.2) = 1.6015625 * 2^-3; / 0.5 = 1.6015625 * 2^-2; M = round(4.81) = 5, E = 5; sign.
  x[6] = -0.2f;
  record[6] = 0xAD;
  expect_single_record<Fp8RowsFormat>(cache, 1, x, record);

  std::vector<std::int64_t> slots = {1};
  std::vector<float> out(512, 12345.0f);
  ASSERT_TRUE(gather_from_cache(cache.view, TensorView::contiguous(slots.data(), DType::kI64, {1}),
                                TensorView::contiguous(out.data(), DType::kF32, {1, 512}))
                  .ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 224.0f);  // 448 * 0.5
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], -224.0f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], std::ldexp(1.0f, -9));  // 2 * 2^-9 * 0.5
  EXPECT_EQ(out[6], -0.203125f);            // -1.625 * 2^-2 * 0.5
  EXPECT_EQ(out[7], 0.0f);
}

}  // namespace
}  // namespace smla::testing
