// RoPE tables (spec 1.6) and the apply_rope entry.
#include "smla/rope.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "src/core/argument_checks.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {

using namespace layer_detail;

RopeConfig RopeConfig::swa_only() { return RopeConfig{10000.0, 1.0, 65536, 32.0, 1.0}; }
RopeConfig RopeConfig::compressed() { return RopeConfig{160000.0, 16.0, 65536, 32.0, 1.0}; }

namespace {

// Dimension index at which a frequency completes `rotations` turns over the
// original context (YaRN's correction dimension).
double correction_dim(double rotations, double base, double original_max) {
  return kRopeDim * std::log(original_max / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

Expected<std::array<double, kRopePairs>> rope_inverse_frequencies(const RopeConfig& c) {
  if (!(std::isfinite(c.theta) && c.theta > 1.0)) {
    return invalid_argument("rope.theta", "a finite value > 1", fmt::format("{}", c.theta));
  }
  if (!(std::isfinite(c.yarn_factor) && c.yarn_factor >= 1.0)) {
    return invalid_argument("rope.yarn_factor", "a finite value >= 1", fmt::format("{}", c.yarn_factor));
  }
  std::array<double, kRopePairs> inv{};
  for (int p = 0; p < kRopePairs; ++p) inv[static_cast<std::size_t>(p)] = std::pow(c.theta, -2.0 * p / kRopeDim);
  if (c.yarn_factor == 1.0) return inv;
  if (c.original_max_position < 1 || !(c.beta_fast > 0.0) || !(c.beta_slow > 0.0) || !std::isfinite(c.beta_fast) ||
      !std::isfinite(c.beta_slow)) {
    return invalid_argument("rope yarn parameters", "original_max_position >= 1 and finite positive betas",
                            fmt::format("{}, {}, {}", c.original_max_position, c.beta_fast, c.beta_slow));
  }
  const double original = static_cast<double>(c.original_max_position);
  double low = std::floor(correction_dim(c.beta_fast, c.theta, original));
  double high = std::ceil(correction_dim(c.beta_slow, c.theta, original));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(kRopeDim - 1));
  if (low == high) high += 0.001;  // YaRN's guard against a zero-width ramp
  for (int p = 0; p < kRopePairs; ++p) {
    const double ramp = std::clamp((p - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    const double extrapolated = inv[static_cast<std::size_t>(p)];
    const double interpolated = extrapolated / c.yarn_factor;
    inv[static_cast<std::size_t>(p)] = interpolated * (1.0 - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  return inv;
}

Expected<RopeTable> RopeTable::create(const RopeConfig& config, std::int64_t max_positions) {
  constexpr std::int64_t kMaxTablePositions = std::int64_t{1} << 24;
  if (max_positions < 1 || max_positions > kMaxTablePositions) {
    return invalid_argument("max_positions", fmt::format("a value in [1, {}]", kMaxTablePositions),
                            std::to_string(max_positions));
  }
  auto inv = rope_inverse_frequencies(config);
  if (!inv) return inv.status();
  RopeTable table;
  table.config_ = config;
  table.inv_freq_ = *inv;
  table.max_positions_ = max_positions;
  table.cos_sin_.resize(static_cast<std::size_t>(max_positions * kRopeDim));
  for (std::int64_t pos = 0; pos < max_positions; ++pos) {
    float* row = table.cos_sin_.data() + pos * kRopeDim;
    for (int p = 0; p < kRopePairs; ++p) {
      const double angle = static_cast<double>(pos) * (*inv)[static_cast<std::size_t>(p)];
      row[p] = static_cast<float>(std::cos(angle));
      row[kRopePairs + p] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

TensorView RopeTable::cos_sin() const {
  return TensorView::contiguous(const_cast<float*>(cos_sin_.data()), DType::kF32, {max_positions_, kRopeDim});
}

Expected<layer_detail::RopeShape> layer_detail::validate_rope(const RopeArgs& args, DeviceKind device) {
  if (args.table == nullptr) return invalid_argument("table", "a RopeTable", "nullptr");
  const bool rank2 = args.x.rank == 2;
  SMLA_RETURN_IF_ERROR(rank2 ? check_tensor(args.x, "x", {DType::kF32}, {kAnyExtent, kAnyExtent}, device)
                             : check_tensor(args.x, "x", {DType::kF32}, {kAnyExtent, kAnyExtent, kAnyExtent}, device));
  const std::int64_t dim = args.x.shape[static_cast<std::size_t>(args.x.rank - 1)];
  if (args.rope_offset < 0 || args.rope_offset + kRopeDim > dim) {
    return out_of_range("rope_offset", fmt::format("a value in [0, {}]", dim - kRopeDim),
                        std::to_string(args.rope_offset));
  }
  RopeShape shape;
  shape.tokens = args.x.shape[0];
  shape.heads = rank2 ? 1 : args.x.shape[1];
  shape.stride_token = args.x.stride[0];
  shape.stride_head = rank2 ? 0 : args.x.stride[1];
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  if (device == DeviceKind::kCpu) {
    SMLA_RETURN_IF_ERROR(check_positions(args.positions, "positions", args.table->max_positions()));
  }
  return shape;
}

Problem layer_detail::layer_problem(const RopeArgs& args, const RopeShape& shape) {
  return make_problem(Op::kApplyRope, shape.tokens, shape.heads,
                      static_cast<int>(args.x.shape[static_cast<std::size_t>(args.x.rank - 1)]));
}

Status apply_rope(const Context& context, const RopeArgs& args) {
  return layer_detail::layer_entry(context, "apply_rope", args, &layer_detail::validate_rope);
}

Status apply_rope(const RopeArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return apply_rope(context, args); });
}

}  // namespace smla
