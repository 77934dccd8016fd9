// Bit-exact conversions, checked against values worked out by hand from the
// format definitions (not from the code under test).
#include "smla/numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "smla/kv_format.h"

namespace smla {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0.00390625f), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0.00390625f), 0x3F82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0.00390625f, 2.0f)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // The largest finite f32 rounds to infinity in bf16 (RNE overflow).
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

TEST(Bf16, RoundTripsEveryBf16Value) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float x = bf16_to_f32(static_cast<std::uint16_t>(bits));
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_bf16(x), bits);
  }
}

TEST(E4M3, DecodesHandPickedCodes) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);  // smallest normal 2^-6
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
}

TEST(E4M3, EncodesWithRoundingAndSaturation) {
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  // 1.0625 is halfway between 1.0 (even) and 1.125: ties to even.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  // 1.1875 is halfway between 1.125 (odd) and 1.25 (even).
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);
  // Subnormals: 1.5 * 2^-9 ties to 2 * 2^-9; 0.5 * 2^-9 ties to 0.
  EXPECT_EQ(f32_to_e4m3(1.5f * 0.001953125f), 0x02);
  EXPECT_EQ(f32_to_e4m3(0.5f * 0.001953125f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  // 464 is halfway between 448 and the (non-existent) 480: saturates to 448.
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);
  // Just below the smallest normal rounds up into it.
  EXPECT_EQ(f32_to_e4m3(0.0155f), 0x08);
}

TEST(E4M3, RoundTripsEveryFiniteCode) {
  for (int code = 0; code < 256; ++code) {
    const float x = e4m3_to_f32(static_cast<std::uint8_t>(code));
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_e4m3(x), code) << "code " << code;
  }
}

TEST(E4M3, EncodingIsNearestAgainstBruteForce) {
  // For many values, the chosen code must be a nearest finite code.
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(static_cast<float>(i % 1000) / 1000.0f + 0.001f, (i / 1000) % 30 - 15);
    const float got = e4m3_to_f32(f32_to_e4m3(x));
    float best = 0.0f;
    for (int code = 0; code < 0x7F; ++code) {
      const float c = e4m3_to_f32(static_cast<std::uint8_t>(code));
      if (std::fabs(c - x) < std::fabs(best - x)) best = c;
    }
    if (x > 448.0f) best = 448.0f;
    ASSERT_EQ(std::fabs(got - x), std::fabs(best - x)) << x;
  }
}

TEST(Ue8m0, DecodesPowersOfTwo) {
  EXPECT_EQ(ue8m0_to_f32(127), 1.0f);
  EXPECT_EQ(ue8m0_to_f32(128), 2.0f);
  EXPECT_EQ(ue8m0_to_f32(114), std::ldexp(1.0f, -13));
  EXPECT_EQ(ue8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(ue8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(255)));
}

TEST(TileExponent, MatchesCeilLog2) {
  EXPECT_EQ(fp8_tile_exponent(448.0f), 0);
  EXPECT_EQ(fp8_tile_exponent(449.0f), 1);
  EXPECT_EQ(fp8_tile_exponent(896.0f), 1);
  EXPECT_EQ(fp8_tile_exponent(224.0f), -1);
  EXPECT_EQ(fp8_tile_exponent(336.0f), 0);
  EXPECT_EQ(fp8_tile_exponent(0.0f), -22);  // clamped to 1e-4: ceil(log2(1e-4/448)) = -22
  EXPECT_EQ(fp8_tile_exponent(1.0f), -8);   // 448 * 2^-8 = 1.75 >= 1 > 0.875
  for (int k = -30; k < 30; ++k) {
    const float amax = std::ldexp(448.0f, k);
    if (amax < 1e-4f) continue;
    ASSERT_EQ(fp8_tile_exponent(amax), k);
    ASSERT_EQ(fp8_tile_exponent(std::nextafter(amax, 1e30f)), k + 1);
  }
  EXPECT_EQ(ue8m0_from_exponent(-13), 114);
  EXPECT_EQ(ue8m0_from_exponent(-200), 0);
  EXPECT_EQ(ue8m0_from_exponent(200), 254);
}

}  // namespace
}  // namespace smla
