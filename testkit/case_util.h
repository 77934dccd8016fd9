// Internal helpers shared by the case builders (not part of the testkit API).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "smla/numeric.h"
#include "smla/tensor.h"

namespace smla::testkit::detail {

using Rng = std::mt19937_64;

inline float random_normal(Rng& rng, double sigma) {
  std::normal_distribution<double> dist(0.0, sigma);
  return static_cast<float>(dist(rng));
}

// Bulk test data: an approximately normal value (Irwin-Hall sum of four
// 16-bit uniforms, bounded at ~3.5 sigma) from one splitmix64 step, far
// cheaper than std::normal_distribution, so filling large caches stays fast.
class BulkNormal {
 public:
  explicit BulkNormal(Rng& rng) : state_(rng()) {}
  float next(double sigma) {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double sum = static_cast<double>((z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48));
    // Four uniforms on [0, 65535]: mean 131070, variance 4 * 65536^2 / 12.
    constexpr double kMean = 2.0 * 65535.0;
    constexpr double kInvSigma = 1.7320508075688772 / 65536.0;  // sqrt(3) / 65536
    return static_cast<float>((sum - kMean) * kInvSigma * sigma);
  }

 private:
  std::uint64_t state_;
};

inline std::int64_t random_int(Rng& rng, std::int64_t lo, std::int64_t hi) {  // inclusive
  std::uniform_int_distribution<std::int64_t> dist(lo, hi);
  return dist(rng);
}

inline bool random_bernoulli(Rng& rng, double p) {
  if (p <= 0.0) return false;
  std::bernoulli_distribution dist(p > 1.0 ? 1.0 : p);
  return dist(rng);
}

// `count` distinct values of [0, n) in random order (count <= n).
inline std::vector<std::int64_t> distinct_sample(Rng& rng, std::int64_t n, std::int64_t count) {
  std::vector<std::int64_t> pool(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) pool[static_cast<std::size_t>(i)] = i;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto j = static_cast<std::size_t>(random_int(rng, i, n - 1));
    std::swap(pool[static_cast<std::size_t>(i)], pool[j]);
  }
  pool.resize(static_cast<std::size_t>(count));
  return pool;
}

// An index no cache of `num_slots` rows can serve: negative or >= num_slots.
inline std::int32_t random_invalid_index(Rng& rng, std::int64_t num_slots) {
  const std::int64_t bounded = std::min<std::int64_t>(num_slots, std::numeric_limits<std::int32_t>::max() - 100);
  switch (random_int(rng, 0, 5)) {
    case 0:
      return -1;
    case 1:
      return -2;
    case 2:
      return std::numeric_limits<std::int32_t>::min();
    case 3:
      return static_cast<std::int32_t>(bounded);
    case 4:
      return static_cast<std::int32_t>(bounded + 17);
    default:
      return std::numeric_limits<std::int32_t>::max();
  }
}

template <class T>
T& at(const TensorView& view, std::int64_t i) {
  return view.ptr<T>()[i * view.stride[0]];
}
template <class T>
T& at(const TensorView& view, std::int64_t i, std::int64_t j) {
  return view.ptr<T>()[i * view.stride[0] + j * view.stride[1]];
}
template <class T>
T& at(const TensorView& view, std::int64_t i, std::int64_t j, std::int64_t k) {
  return view.ptr<T>()[i * view.stride[0] + j * view.stride[1] + k * view.stride[2]];
}

inline void fill_sink(const TensorView& sink, Rng& rng) {
  for (std::int64_t h = 0; h < sink.shape[0]; ++h) {
    // Every fourth head carries -inf, as padded heads do in production.
    at<float>(sink, h) = h % 4 == 3 ? -std::numeric_limits<float>::infinity() : random_normal(rng, 1.0);
  }
}

inline void fill_bf16_normal(const TensorView& view, Rng& rng, double sigma) {
  BulkNormal normal(rng);
  for (std::int64_t i = 0; i < view.shape[0]; ++i) {
    for (std::int64_t j = 0; j < view.shape[1]; ++j) {
      if (view.rank == 2) {
        at<std::uint16_t>(view, i, j) = f32_to_bf16(normal.next(sigma));
        continue;
      }
      for (std::int64_t k = 0; k < view.shape[2]; ++k) {
        at<std::uint16_t>(view, i, j, k) = f32_to_bf16(normal.next(sigma));
      }
    }
  }
}

}  // namespace smla::testkit::detail
