// Division by a divisor known once per launch (a page size), as a multiply-high,
// an add and a shift: no branch and no division sequence per key.
// Granlund and Montgomery's round-up method (Hacker's Delight, 10-9), for
// dividends below 2^31 (so the add cannot carry out of 32 bits).
#pragma once

#include <cstdint>

#include "smla/numeric.h"  // SMLA_HOST_DEVICE

namespace smla::cuda {

struct UnsignedDivisor {
  std::uint32_t magic = 1;  // the multiplier's low 32 bits (its bit 32 is implied)
  std::uint32_t shift = 0;

  // divisor in [1, 2^31). On the host: the 64-bit division would be a subroutine
  // call on the device.
  static constexpr UnsignedDivisor of(std::uint32_t divisor) {
    std::uint32_t log2_ceil = 0;
    while ((std::uint64_t{1} << log2_ceil) < divisor) ++log2_ceil;
    const std::uint64_t above = (std::uint64_t{1} << log2_ceil) - divisor;  // 2^l - d < d
    return {static_cast<std::uint32_t>((above << 32) / divisor + 1), log2_ceil};
  }
  // A divisor at least as large as every dividend: the quotient is 0.
  static constexpr UnsignedDivisor beyond_all() { return {0, 31}; }

  // dividend < 2^31.
  SMLA_HOST_DEVICE std::uint32_t divide(std::uint32_t dividend) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t high = __umulhi(dividend, magic);
#else
    const auto high = static_cast<std::uint32_t>((static_cast<std::uint64_t>(dividend) * magic) >> 32);
#endif
    return (high + dividend) >> shift;
  }
};

}  // namespace smla::cuda
