#include "testkit/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "smla/numeric.h"

namespace smla::testkit {

namespace {

// Calls fn(flat_index, element_offset) for every element of `view` in row-major order.
template <class Fn>
void for_each_element(const TensorView& view, Fn&& fn) {
  if (!view.present() || view.numel() <= 0) return;
  std::int64_t index[kMaxRank] = {};
  const std::int64_t total = view.numel();
  for (std::int64_t flat = 0; flat < total; ++flat) {
    std::int64_t offset = 0;
    for (int d = 0; d < view.rank; ++d) offset += index[d] * view.stride[static_cast<std::size_t>(d)];
    fn(flat, offset);
    for (int d = view.rank - 1; d >= 0; --d) {
      if (++index[d] < view.shape[static_cast<std::size_t>(d)]) break;
      index[d] = 0;
    }
  }
}

constexpr std::uint16_t kPoisonBf16 = 0x7FA5;  // signalling NaN: computations never produce it
constexpr std::uint32_t kPoisonF32 = 0x7FA5A5A5u;
constexpr std::uint64_t kPoisonF64 = 0x7FF4A5A5A5A5A5A5ull;
constexpr std::uint8_t kPoisonByte = 0x7F;  // e4m3 NaN; integers become 0x7F7F...

double load_as_double(const TensorView& view, std::int64_t offset) {
  const auto* base =
      static_cast<const std::uint8_t*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.dtype));
  switch (view.dtype) {
    case DType::kBF16: {
      std::uint16_t bits;
      std::memcpy(&bits, base, 2);
      return bf16_to_f32(bits);
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, base, 4);
      return v;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, base, 8);
      return v;
    }
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

int value_class(double x) {
  if (std::isnan(x)) return 1;
  if (std::isinf(x)) return x > 0 ? 2 : 3;
  return 0;
}

ErrorStats compare_as(const TensorView& got, const TensorView& want, DType dtype, const Tolerance& tolerance) {
  ErrorStats stats;
  stats.tolerance_cosine = tolerance.max_cosine_diff;
  bool same_shape =
      got.present() && want.present() && got.rank == want.rank && got.dtype == dtype && want.dtype == dtype;
  for (int d = 0; same_shape && d < got.rank; ++d) {
    same_shape = got.shape[static_cast<std::size_t>(d)] == want.shape[static_cast<std::size_t>(d)];
  }
  if (!same_shape) {
    stats.shape_mismatch = true;
    return stats;
  }
  // Offsets of `want` visited in the same row-major order as `got`.
  std::vector<std::int64_t> want_offsets;
  want_offsets.reserve(static_cast<std::size_t>(want.numel()));
  for_each_element(want, [&](std::int64_t, std::int64_t offset) { want_offsets.push_back(offset); });
  double dot = 0.0, norm_got = 0.0, norm_want = 0.0;
  for_each_element(got, [&](std::int64_t flat, std::int64_t offset) {
    const double g = load_as_double(got, offset);
    const double w = load_as_double(want, want_offsets[static_cast<std::size_t>(flat)]);
    ++stats.count;
    if (value_class(g) != value_class(w)) {
      if (stats.nan_mismatch++ == 0) {
        stats.worst_index = flat;
        stats.worst_got = g;
        stats.worst_want = w;
      }
      ++stats.num_outside;
      return;
    }
    if (value_class(g) != 0) return;  // same non-finite class: equal
    const double abs_err = std::fabs(g - w);
    dot += g * w;
    norm_got += g * g;
    norm_want += w * w;
    if (w != 0.0) stats.max_rel_err = std::max(stats.max_rel_err, abs_err / std::fabs(w));
    if (abs_err > stats.max_abs_err) {
      stats.max_abs_err = abs_err;
      if (stats.nan_mismatch == 0) {
        stats.worst_index = flat;
        stats.worst_got = g;
        stats.worst_want = w;
      }
    }
    if (abs_err > tolerance.abs && abs_err > tolerance.rel * std::fabs(w)) ++stats.num_outside;
  });
  if (norm_got == 0.0 && norm_want == 0.0) {
    stats.cosine_diff = 0.0;
  } else if (norm_got == 0.0 || norm_want == 0.0) {
    stats.cosine_diff = 1.0;
  } else {
    stats.cosine_diff = std::max(0.0, 1.0 - dot / std::sqrt(norm_got * norm_want));
  }
  return stats;
}

bool is_poison(const TensorView& view, std::int64_t offset) {
  const std::size_t size = dtype_size(view.dtype);
  const auto* base = static_cast<const std::uint8_t*>(view.data) + offset * static_cast<std::int64_t>(size);
  switch (view.dtype) {
    case DType::kBF16:
    case DType::kF16: {
      std::uint16_t bits;
      std::memcpy(&bits, base, 2);
      return bits == kPoisonBf16;
    }
    case DType::kF32: {
      std::uint32_t bits;
      std::memcpy(&bits, base, 4);
      return bits == kPoisonF32;
    }
    case DType::kF64: {
      std::uint64_t bits;
      std::memcpy(&bits, base, 8);
      return bits == kPoisonF64;
    }
    default:
      for (std::size_t i = 0; i < size; ++i) {
        if (base[i] != kPoisonByte) return false;
      }
      return true;
  }
}

}  // namespace

bool ErrorStats::passed() const {
  return !shape_mismatch && nan_mismatch == 0 && num_outside == 0 && cosine_diff <= tolerance_cosine;
}

std::string ErrorStats::to_string() const {
  if (shape_mismatch) return "shape or dtype mismatch";
  return fmt::format(
      "count={} max_abs={:.3g} max_rel={:.3g} cos_diff={:.3g} nan_mismatch={} outside={} "
      "worst[{}]: got {} want {}",
      count, max_abs_err, max_rel_err, cosine_diff, nan_mismatch, num_outside, worst_index, worst_got, worst_want);
}

ErrorStats compare_bf16(const TensorView& got, const TensorView& want, const Tolerance& tolerance) {
  return compare_as(got, want, DType::kBF16, tolerance);
}

ErrorStats compare_f32(const TensorView& got, const TensorView& want, const Tolerance& tolerance) {
  return compare_as(got, want, DType::kF32, tolerance);
}

void poison(const TensorView& view) {
  const std::size_t size = dtype_size(view.dtype);
  for_each_element(view, [&](std::int64_t, std::int64_t offset) {
    auto* base = static_cast<std::uint8_t*>(view.data) + offset * static_cast<std::int64_t>(size);
    switch (view.dtype) {
      case DType::kBF16:
      case DType::kF16:
        std::memcpy(base, &kPoisonBf16, 2);
        break;
      case DType::kF32:
        std::memcpy(base, &kPoisonF32, 4);
        break;
      case DType::kF64:
        std::memcpy(base, &kPoisonF64, 8);
        break;
      default:
        std::memset(base, kPoisonByte, size);
        break;
    }
  });
}

std::int64_t count_poisoned(const TensorView& view) {
  std::int64_t count = 0;
  for_each_element(view, [&](std::int64_t, std::int64_t offset) { count += is_poison(view, offset) ? 1 : 0; });
  return count;
}

bool all_written(const TensorView& view) { return count_poisoned(view) == 0; }

}  // namespace smla::testkit
