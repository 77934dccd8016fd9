// File: rope.h
//
// DeepSeek-V4 rotary position embedding (spec 1.4, 1.6, 1.11). One table per
// layer type, shared by the query, the sliding-window KV, the compressors, the
// indexer query and the inverse rotation of the attention output.
//
// GPT-J (interleaved-pair) layout: pair p rotates (x[off+2p], x[off+2p+1]) by
// angle pos * inv_freq[p]; forward: e' = e c - o s, o' = e s + o c; inverse:
// e' = e c + o s, o' = o c - e s. The magnitude scale is exactly 1 for V4
// (mscale = mscale_all_dim = 0), so cos/sin are never scaled.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

inline constexpr int kRopeDim = V4Fp8Format::kRopeDim;  // 64 rotated dims
inline constexpr int kRopePairs = kRopeDim / 2;        // 32 frequencies

// Parameters of one rotary table. yarn_factor == 1 means plain RoPE.
struct RopeConfig {
  double theta = 10000.0;
  double yarn_factor = 1.0;
  std::int64_t original_max_position = 65536;
  double beta_fast = 32.0;
  double beta_slow = 1.0;

  // SWA-only layers: theta 10000, no scaling.
  static RopeConfig swa_only();
  // C4A and C128A layers: theta 160000, YaRN factor 16, original length 65536,
  // beta_fast 32, beta_slow 1.
  static RopeConfig compressed();
};

// The 32 inverse frequencies of a config (YaRN ramp blend when yarn_factor != 1),
// in double precision. Fails on non-finite or non-positive parameters.
Expected<std::array<double, kRopePairs>> rope_inverse_frequencies(const RopeConfig& config);

// An owned table: f32 [max_positions, 64], row = cos[0..31] || sin[0..31]
// (angles computed in double, rounded once). The config is kept so the float64
// reference can recompute angles independently of the f32 table.
class RopeTable {
 public:
  static Expected<RopeTable> create(const RopeConfig& config, std::int64_t max_positions);

  const RopeConfig& config() const { return config_; }
  const std::array<double, kRopePairs>& inverse_frequencies() const { return inv_freq_; }
  std::int64_t max_positions() const { return max_positions_; }
  // f32 [max_positions, 64]
  TensorView cos_sin() const;
  const float* row(std::int64_t position) const { return cos_sin_.data() + position * kRopeDim; }

 private:
  RopeConfig config_;
  std::array<double, kRopePairs> inv_freq_{};
  std::int64_t max_positions_ = 0;
  std::vector<float> cos_sin_;
};

enum class RopeDirection { kForward, kInverse };

// In-place rotation of dims [rope_offset, rope_offset + 64) of every row.
struct RopeArgs {
  TensorView x;                  // [T, H, d] or [T, d] f32, rotated in place
  TensorView positions;          // [T] i32 or i64, each in [0, table->max_positions())
  const RopeTable* table = nullptr;
  int rope_offset = V4Fp8Format::kNopeDim;  // 448 for the 512-dim heads, 64 for the indexer
  RopeDirection direction = RopeDirection::kForward;
};

// Runs on the context's backend (smla/context.h; cuda: every tensor on the
// context's device, enqueued on its stream, see smla/layer.h "On the device").
Status apply_rope(const Context& context, const RopeArgs& args);
// One call in default_context(backend).
Status apply_rope(const RopeArgs& args, Backend backend = Backend::kCpu);

}  // namespace smla
