// The two e4m3 -> bf16 expansions of src/cuda/common/kv_loaders.cuh must agree bit for
// bit: the f32 route (any scale) and the bf16x2 route the Hopper kernel uses for
// UE8M0 scales. Every (code, scale byte) pair, and every code against a list of
// f32 scales on the f32 route, is checked on the device; the expected values
// come from the host codec's decode (smla::e4m3_to_f32 times the scale in f32,
// rounded to bf16), not from either device route. The Hopper producer's decoding of a
// V4 key's seven scales at once (sm90 V4Units::decode_scales) is checked the same way.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "smla/numeric.h"
#include "src/cuda/common/kv_loaders.cuh"
#include "src/cuda/sm90/sm90_row_loaders.cuh"
#include "testkit/cuda/device_copy.h"

namespace smla::cuda {
namespace {

constexpr int kCodes = 256;
constexpr int kScales = 256;

// out[2 * (scale * 256 + code) + route]: the bf16 bits of code x 2^(scale - 127), route 0 = f32, 1 = bf16x2.
__global__ void expand_every_pair(std::uint16_t* out) {
  const std::uint32_t scale_byte = blockIdx.x;
  const std::uint32_t code = threadIdx.x;
  const std::uint32_t codes = code * 0x01010101u;  // the same code in all four lanes
  const uint2 by_f32 = e4m3x4_to_bf16x4(codes, ue8m0_to_f32(static_cast<std::uint8_t>(scale_byte)));
  const uint2 by_bf16 = e4m3x4_to_bf16x4(codes, ue8m0_to_bf16x2(scale_byte));
  std::uint16_t* at = out + 2 * (scale_byte * kCodes + code);
  // All four lanes must agree too: a lane mix-up shows as a mismatch.
  const bool lanes_agree = (by_f32.x & 0xFFFFu) == (by_f32.x >> 16) && by_f32.x == by_f32.y &&
                           (by_bf16.x & 0xFFFFu) == (by_bf16.x >> 16) && by_bf16.x == by_bf16.y;
  at[0] = lanes_agree ? static_cast<std::uint16_t>(by_f32.x) : 0xDEADu;
  at[1] = lanes_agree ? static_cast<std::uint16_t>(by_bf16.x) : 0xDEADu;
}

bool is_bf16_nan(std::uint16_t bits) { return (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0; }

// The host's exact answer: decode in f64, round to bf16 (round to nearest even, NaN kept).
std::uint16_t expected_bits(int code, int scale_byte) {
  const double value = static_cast<double>(e4m3_to_f32(static_cast<std::uint8_t>(code))) *
                       static_cast<double>(ue8m0_to_f32(static_cast<std::uint8_t>(scale_byte)));
  if (std::isnan(value)) return 0x7FC0u;
  return f32_to_bf16(static_cast<float>(value));  // exact in f32: 4 significant bits times a power of two
}

TEST(CudaDequant, Ue8m0ScaledExpansionMatchesHostBitForBit) {
  if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  cudatest::DeviceBuffer out(2 * kCodes * kScales * sizeof(std::uint16_t));
  expand_every_pair<<<kScales, kCodes>>>(static_cast<std::uint16_t*>(out.data()));
  cudatest::check_cuda(cudaGetLastError(), "launch");
  std::vector<std::uint16_t> bits(2 * kCodes * kScales);
  cudatest::check_cuda(cudaMemcpy(bits.data(), out.data(), bits.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost),
                       "copy back");
  int mismatches = 0;
  for (int scale = 0; scale < kScales; ++scale) {
    for (int code = 0; code < kCodes; ++code) {
      const std::uint16_t want = expected_bits(code, scale);
      for (int route = 0; route < 2; ++route) {
        const std::uint16_t got = bits[2 * (scale * kCodes + code) + route];
        const bool same = is_bf16_nan(want) ? is_bf16_nan(got) : got == want;
        if (!same && ++mismatches <= 10) {
          ADD_FAILURE() << "code 0x" << std::hex << code << " scale byte 0x" << scale << " route "
                        << (route == 0 ? "f32" : "bf16x2") << ": got 0x" << got << ", want 0x" << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// out[s * 256 + code]: the bf16 bits of code x scales[s] through expand_unit_by's f32
// route (V3.2's f32 scales, the plain-FP8 tensor scale), 0xDEAD where the 16 values of the unit disagree.
__global__ void expand_every_code_by_f32(const float* scales, std::uint16_t* out) {
  const std::uint32_t code = threadIdx.x;
  const std::uint32_t word = code * 0x01010101u;
  uint4 low, high;
  expand_unit_by(make_uint4(word, word, word, word), scales[blockIdx.x], &low, &high);
  const std::uint32_t lanes[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
  bool agree = true;
  for (const std::uint32_t lane : lanes) agree = agree && lane == lanes[0] && (lane & 0xFFFFu) == (lane >> 16);
  out[blockIdx.x * kCodes + code] = agree ? static_cast<std::uint16_t>(lanes[0]) : 0xDEADu;
}

// Every power of two of f32 (subnormals included), both signs, the value just below
// each, and a few arbitrary, zero, huge and non-finite scales.
std::vector<float> f32_scales_to_check() {
  std::vector<float> scales;
  for (int e = -149; e <= 127; ++e) {
    scales.push_back(std::ldexp(1.0f, e));
    scales.push_back(-std::ldexp(1.0f, e));
    scales.push_back(std::nextafter(std::ldexp(1.0f, e), 0.0f));
  }
  for (const float v : {0.0f, -0.0f, 1.5f, 0.3f, 1.0f / 448.0f, 3.0e-39f, 1.0e38f, 3.4e38f}) scales.push_back(v);
  scales.push_back(std::numeric_limits<float>::infinity());
  scales.push_back(-std::numeric_limits<float>::infinity());
  scales.push_back(std::numeric_limits<float>::quiet_NaN());
  return scales;
}

TEST(CudaDequant, F32ScaledExpansionMatchesHostBitForBit) {
  if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> scales = f32_scales_to_check();
  cudatest::DeviceBuffer scales_d(scales.size() * sizeof(float));
  cudatest::DeviceBuffer out(scales.size() * kCodes * sizeof(std::uint16_t));
  cudatest::check_cuda(cudaMemcpy(scales_d.data(), scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice),
                       "copy scales");
  expand_every_code_by_f32<<<static_cast<unsigned>(scales.size()), kCodes>>>(static_cast<const float*>(scales_d.data()),
                                                                            static_cast<std::uint16_t*>(out.data()));
  cudatest::check_cuda(cudaGetLastError(), "launch");
  std::vector<std::uint16_t> bits(scales.size() * kCodes);
  cudatest::check_cuda(cudaMemcpy(bits.data(), out.data(), bits.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost),
                       "copy back");
  int mismatches = 0;
  for (std::size_t s = 0; s < scales.size(); ++s) {
    for (int code = 0; code < kCodes; ++code) {
      const float value = e4m3_to_f32(static_cast<std::uint8_t>(code)) * scales[s];  // the host codec's product
      const std::uint16_t want = std::isnan(value) ? 0x7FC0u : f32_to_bf16(value);
      const std::uint16_t got = bits[s * kCodes + code];
      const bool same = is_bf16_nan(want) ? is_bf16_nan(got) : got == want;
      if (!same && ++mismatches <= 10) {
        ADD_FAILURE() << "code 0x" << std::hex << code << " scale " << std::hexfloat << scales[s] << ": got 0x" << got
                      << ", want 0x" << want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// out[7 * k + t]: the bf16x2 bits V4Units::decode_scales gives tile t of key k's scale footer.
__global__ void decode_every_footer(const uint2* footers, int count, std::uint32_t* out) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= count) return;
  const auto decoded = sm90::V4Units::decode_scales(footers[k]);
  for (int t = 0; t < V4Fp8Format::kNumTiles; ++t) {
    out[V4Fp8Format::kNumTiles * k + t] = *reinterpret_cast<const std::uint32_t*>(&decoded.tile[t]);
  }
}

// Every scale byte at every tile position, the other tiles random (now and then 0 or
// 0xFF, which sends a whole footer down the exact path), the pad byte anything.
TEST(CudaDequant, V4FooterDecodedAtOnceMatchesHost) {
  if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> any_byte(0, 255);
  std::vector<std::array<std::uint8_t, 8>> footers;
  for (int tile = 0; tile < V4Fp8Format::kNumTiles; ++tile) {
    for (int byte = 0; byte < 256; ++byte) {
      for (int copy = 0; copy < 4; ++copy) {
        std::array<std::uint8_t, 8> footer{};
        for (int t = 0; t < 8; ++t) {
          const int other = any_byte(rng);
          // mostly usual scales (1..254), which keep the fast path unless `byte` is 0 or 0xFF
          footer[t] = static_cast<std::uint8_t>(copy == 3 ? other : 1 + other % 254);
        }
        footer[7] = static_cast<std::uint8_t>(copy == 0 ? 0 : copy == 1 ? 0xFF : any_byte(rng));  // the pad byte
        footer[tile] = static_cast<std::uint8_t>(byte);
        footers.push_back(footer);
      }
    }
  }
  const int count = static_cast<int>(footers.size());
  std::vector<uint2> words(footers.size());
  std::memcpy(words.data(), footers.data(), footers.size() * sizeof(uint2));
  cudatest::DeviceBuffer footers_d(words.size() * sizeof(uint2));
  cudatest::DeviceBuffer out(words.size() * V4Fp8Format::kNumTiles * sizeof(std::uint32_t));
  cudatest::check_cuda(cudaMemcpy(footers_d.data(), words.data(), words.size() * sizeof(uint2), cudaMemcpyHostToDevice),
                       "copy footers");
  cudatest::check_cuda(cudaMemset(out.data(), 0xA5, words.size() * V4Fp8Format::kNumTiles * sizeof(std::uint32_t)),
                       "poison");
  decode_every_footer<<<(count + 127) / 128, 128>>>(static_cast<const uint2*>(footers_d.data()), count,
                                                  static_cast<std::uint32_t*>(out.data()));
  cudatest::check_cuda(cudaGetLastError(), "launch");
  std::vector<std::uint32_t> got(words.size() * V4Fp8Format::kNumTiles);
  cudatest::check_cuda(cudaMemcpy(got.data(), out.data(), got.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
                       "copy back");
  int mismatches = 0;
  for (int k = 0; k < count; ++k) {
    for (int t = 0; t < V4Fp8Format::kNumTiles; ++t) {
      const float scale = ue8m0_to_f32(footers[k][t]);  // the host codec: 2^(b - 127), NaN for 0xFF
      const std::uint32_t half = std::isnan(scale) ? 0x7FC0u : f32_to_bf16(scale);
      const std::uint32_t word = got[V4Fp8Format::kNumTiles * k + t];
      const bool same = std::isnan(scale) ? is_bf16_nan(word & 0xFFFFu) && is_bf16_nan(word >> 16)
                                          : word == (half | half << 16);
      if (!same && ++mismatches <= 10) {
        ADD_FAILURE() << "footer " << k << " tile " << t << " byte 0x" << std::hex << int{footers[k][t]} << ": got 0x"
                      << word << ", want 0x" << (half | half << 16);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace smla::cuda
