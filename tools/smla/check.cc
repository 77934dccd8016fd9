#include "tools/smla/check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "smla/numeric.h"
#include "tools/smla/tensor_walk.h"

namespace smla::cli {

namespace {

// Largest finite |x| of a bf16 tensor of any strides.
double max_abs_finite_bf16(const TensorView& view) {
  if (view.dtype != DType::kBF16) return 0.0;
  const auto* base = static_cast<const std::uint16_t*>(view.data);
  double result = 0.0;
  for_each_element_offset(view, [&](std::int64_t offset) {
    const float x = bf16_to_f32(base[offset]);
    if (std::isfinite(x)) result = std::max(result, static_cast<double>(std::fabs(x)));
  });
  return result;
}

}  // namespace

testkit::ErrorStats check_bf16_output(const TensorView& got, const TensorView& want) {
  testkit::Tolerance tolerance;
  tolerance.abs = kOutputTolerance * max_abs_finite_bf16(want);
  tolerance.rel = 0.0;
  tolerance.max_cosine_diff = 1.0;
  return testkit::compare_bf16(got, want, tolerance);
}

testkit::ErrorStats check_f32_output(const TensorView& got, const TensorView& want) {
  testkit::Tolerance tolerance;
  tolerance.abs = kLseAbsTolerance;
  tolerance.rel = kLseRelTolerance;
  tolerance.max_cosine_diff = 1.0;
  return testkit::compare_f32(got, want, tolerance);
}

}  // namespace smla::cli
