// Shared helpers of the libFuzzer targets: invariant checks that crash (so
// libFuzzer records the input), and TensorViews with random shapes and strides
// whose every element lies inside a small arena.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "smla/tensor.h"

// An invariant of the code under test: a failure aborts with the condition, and
// libFuzzer saves the input as a crash.
#define SMLA_FUZZ_CHECK(cond)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (false)

// The harness's own loops (arena fill, write checks) are not code under test:
// without coverage callbacks and ASan checks in them the fuzzer spends its time
// in smla, and their comparisons do not steer the mutator. (They only touch
// bytes of arenas they own.)
#define SMLA_FUZZ_HARNESS_ONLY __attribute__((no_sanitize("coverage", "address")))

namespace smla::fuzz {

// A heap block of exactly `bytes` bytes (so ASan sees any access past its end).
// Its first bytes come from the input (at most a quarter of what is left, so
// that the choices made after it still have input), the rest from a generator
// seeded by them. Keeps a copy to detect writes.
class Arena {
 public:
  SMLA_FUZZ_HARNESS_ONLY Arena(FuzzedDataProvider& fdp, std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 1)) {
    data_ = static_cast<std::byte*>(std::malloc(bytes_));
    SMLA_FUZZ_CHECK(data_ != nullptr);
    const std::vector<std::uint8_t> fill =
        fdp.ConsumeBytes<std::uint8_t>(std::min(bytes_, fdp.remaining_bytes() / 4));
    if (!fill.empty()) std::memcpy(data_, fill.data(), fill.size());
    std::uint64_t state = 0x9E3779B97F4A7C15ull ^ bytes_;
    for (std::uint8_t b : fill) state = (state ^ b) * 0x100000001B3ull;
    // Plain loops and fixed-size copies only: a call into an instrumented std::
    // helper would not be inlined here.
    const std::size_t filled = fill.size(), total = bytes_;
    std::byte* const out = data_;
    std::size_t i = filled;
    for (; i + 8 <= total; i += 8) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const std::uint64_t word = state ^ (state >> 29);
      std::memcpy(out + i, &word, 8);
    }
    for (; i < total; ++i) out[i] = static_cast<std::byte>(state >> 40 >> (8 * (i % 4)));
  }
  ~Arena() { std::free(data_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  void snapshot() { copy_.assign(data_, data_ + bytes_); }
  SMLA_FUZZ_HARNESS_ONLY bool unchanged() const { return copy_.size() == bytes_ && std::memcmp(copy_.data(), data_, bytes_) == 0; }
  const std::vector<std::byte>& before() const { return copy_; }

 private:
  std::size_t bytes_;
  std::byte* data_ = nullptr;
  std::vector<std::byte> copy_;
};

// A view of `dtype` with the given extents inside `arena`: random non-negative
// (sometimes negative, sometimes zero or broadcast) strides, last dimension
// contiguous unless `any_last_stride`; shrinks extents to 0 when they cannot fit.
// Returns an absent view when asked for rank < 0.
inline TensorView view_in(FuzzedDataProvider& fdp, const Arena& arena, DType dtype,
                          std::initializer_list<std::int64_t> extents, bool any_last_stride = false) {
  TensorView v;
  v.dtype = dtype;
  v.rank = static_cast<int>(extents.size());
  const auto item = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t capacity = static_cast<std::int64_t>(arena.bytes()) / item;
  std::size_t d = 0;
  for (std::int64_t e : extents) v.shape[d++] = e;
  // Strides: dense row-major, with random padding per dimension, sometimes 0 or negative.
  std::int64_t running = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    std::int64_t stride = running + fdp.ConsumeIntegralInRange<std::int64_t>(0, 3);
    const int mode = fdp.ConsumeIntegralInRange<int>(0, 15);  // 0 when the input is used up: dense
    if (i == v.rank - 1 && !any_last_stride) stride = 1;
    else if (mode == 15) stride = 0;                     // broadcast
    else if (mode == 14) stride = -stride;               // reversed
    v.stride[u] = stride;
    running = std::max<std::int64_t>(running, std::max<std::int64_t>(stride, -stride) * std::max<std::int64_t>(v.shape[u], 1));
  }
  // Lowest and highest element offsets relative to the base pointer.
  std::int64_t low = 0, high = 0;
  for (int i = 0; i < v.rank; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (v.shape[u] <= 0) continue;
    const std::int64_t reach = (v.shape[u] - 1) * v.stride[u];
    (reach < 0 ? low : high) += reach;
  }
  bool empty = false;
  for (int i = 0; i < v.rank; ++i) empty = empty || v.shape[static_cast<std::size_t>(i)] == 0;
  if (!empty && high - low + 1 > capacity) {
    v.shape[0] = 0;  // cannot fit: an empty view instead
    empty = true;
  }
  std::int64_t base = 0;
  if (!empty) base = -low + fdp.ConsumeIntegralInRange<std::int64_t>(0, capacity - (high - low + 1));
  v.data = arena.data() + base * item;
  return v;
}

// Marks in `covered` every byte of every element of a present view with
// positive extents (rank <= 4), as offsets from the arena start.
SMLA_FUZZ_HARNESS_ONLY inline void mark_view_bytes(const TensorView& v, const Arena& arena, std::vector<std::uint8_t>& covered) {
  if (!v.present() || v.data == nullptr) return;
  std::int64_t shape[kMaxRank] = {1, 1, 1, 1}, stride[kMaxRank] = {0, 0, 0, 0};
  for (int i = 0; i < v.rank && i < kMaxRank; ++i) {
    shape[i] = v.shape[static_cast<std::size_t>(i)];
    stride[i] = v.stride[static_cast<std::size_t>(i)];
    if (shape[i] <= 0) return;
  }
  const auto item = static_cast<std::int64_t>(dtype_size(v.dtype));
  const std::int64_t base = static_cast<const std::byte*>(v.data) - arena.data();
  const auto size = static_cast<std::int64_t>(covered.size());
  std::uint8_t* const mask = covered.data();
  for (std::int64_t a = 0; a < shape[0]; ++a)
    for (std::int64_t b = 0; b < shape[1]; ++b)
      for (std::int64_t c = 0; c < shape[2]; ++c)
        for (std::int64_t d = 0; d < shape[3]; ++d) {
          const std::int64_t offset = base + (a * stride[0] + b * stride[1] + c * stride[2] + d * stride[3]) * item;
          for (std::int64_t byte = offset; byte < offset + item; ++byte) {
            if (byte >= 0 && byte < size) mask[byte] = 1;
          }
        }
}

// True when every byte of `arena` that `v` does not cover is as in the snapshot.
SMLA_FUZZ_HARNESS_ONLY inline bool unchanged_outside(const Arena& arena, const std::vector<std::byte>& before,
                                                     const TensorView& v) {
  if (before.size() != arena.bytes()) return false;  // no snapshot taken
  if (arena.unchanged()) return true;
  std::vector<std::uint8_t> covered(arena.bytes(), 0);
  mark_view_bytes(v, arena, covered);
  const std::uint8_t* const mask = covered.data();
  const std::byte* const now = arena.data();
  const std::byte* const then = before.data();
  const std::size_t total = arena.bytes();
  for (std::size_t i = 0; i < total; ++i) {
    if (mask[i] == 0 && now[i] != then[i]) return false;
  }
  return true;
}

// Random extents helper: a value in [lo, hi].
inline std::int64_t extent(FuzzedDataProvider& fdp, std::int64_t lo, std::int64_t hi) {
  return fdp.ConsumeIntegralInRange<std::int64_t>(lo, hi);
}

// With a small probability (never once the input is used up), damages a view the way a careless caller would:
// wrong dtype, rank, a smaller or negative extent, absent, null data, a CUDA
// device, a strided last dim. Never makes a view reach outside its memory.
inline void maybe_damage(FuzzedDataProvider& fdp, TensorView& v) {
  switch (31 - fdp.ConsumeIntegralInRange<int>(0, 31)) {
    case 0: v.dtype = static_cast<DType>(fdp.ConsumeIntegralInRange<int>(0, 7)); break;
    case 1: v.rank = fdp.ConsumeIntegralInRange<int>(-1, kMaxRank); break;
    case 2: v.shape[0] = fdp.ConsumeIntegralInRange<std::int64_t>(-2, std::max<std::int64_t>(v.shape[0], -2)); break;
    case 3: v = TensorView{}; break;
    case 4: v.data = nullptr; break;
    case 5: v.device = Device{DeviceKind::kCuda, 0}; break;
    case 6:  // a strided last dimension over the same memory
      if (v.rank > 0) {
        const auto last = static_cast<std::size_t>(v.rank - 1);
        v.shape[last] /= 2;
        v.stride[last] = 2;
      }
      break;
    default: break;
  }
}

}  // namespace smla::fuzz
