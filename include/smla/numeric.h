// Bit-exact scalar conversions shared by every backend (host and device).
//
// bf16 and e4m3 are stored as raw bits (uint16_t / uint8_t). e4m3 is the OCP
// float8_e4m3fn format: no infinities, 0x7F/0xFF are NaN, largest finite 448.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SMLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SMLA_HOST_DEVICE inline
#endif

namespace smla {

SMLA_HOST_DEVICE std::uint32_t f32_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
SMLA_HOST_DEVICE float f32_from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

SMLA_HOST_DEVICE float bf16_to_f32(std::uint16_t bits) {
  return f32_from_bits(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest even; NaN stays NaN (quieted), infinities stay infinite.
SMLA_HOST_DEVICE std::uint16_t f32_to_bf16(float x) {
  std::uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

SMLA_HOST_DEVICE float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

inline constexpr float kE4M3Max = 448.0f;

SMLA_HOST_DEVICE float e4m3_to_f32(std::uint8_t code) {
  const std::uint32_t sign = (code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> 3) & 0xFu;
  const std::uint32_t mantissa = code & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return f32_from_bits(sign | 0x7FC00000u);
  if (exponent == 0) {  // subnormal: mantissa * 2^-9, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 0.001953125f;
    return sign ? -magnitude : magnitude;
  }
  return f32_from_bits(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// Round to nearest even, saturating to +-448 (Inf too); NaN maps to 0x7F with the sign kept.
SMLA_HOST_DEVICE std::uint8_t f32_to_e4m3(float x) {
  const std::uint32_t u = f32_bits(x);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  std::uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  if (magnitude >= 0x3C800000u) {  // >= 2^-6: normal e4m3, round the mantissa to 3 bits
    magnitude += 0x7FFFFu + ((magnitude >> 20) & 1u);
    magnitude &= ~0xFFFFFu;
    if (magnitude > 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);  // > 448
    const std::uint32_t exponent = (magnitude >> 23) - 120u;
    return static_cast<std::uint8_t>(sign | (exponent << 3) | ((magnitude >> 20) & 7u));
  }
  // Subnormal range: multiples of 2^-9. The product is exact; rint rounds half to even.
  const float steps = std::rint(f32_from_bits(magnitude) * 512.0f);
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(steps));
}

// UE8M0 scale byte b means 2^(b-127); 0xFF is NaN.
SMLA_HOST_DEVICE float ue8m0_to_f32(std::uint8_t b) {
  if (b == 0xFFu) return f32_from_bits(0x7FC00000u);
  if (b == 0) return f32_from_bits(0x00400000u);  // 2^-127, an f32 subnormal
  return f32_from_bits(static_cast<std::uint32_t>(b) << 23);
}

}  // namespace smla
