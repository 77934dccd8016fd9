// kReference: inverse RoPE and the grouped projection in float64 plain loops.
#include <vector>

#include "src/core/strided_access.h"
#include "src/runtime/layer/layer_ops.h"
#include "src/reference/layer/rope_f64.h"

namespace smla::layer_detail {

Status project_output_f64(const OutputProjectionArgs& args, const OutputShape& shape) {
  constexpr int kHeadDim = V4Fp8Format::kHeadDim;
  const std::int64_t heads_per_group = shape.heads / shape.groups;
  const std::int64_t group_width = heads_per_group * kHeadDim;
  std::vector<double> o(static_cast<std::size_t>(shape.heads * kHeadDim));
  std::vector<double> z(static_cast<std::size_t>(shape.groups * shape.rank));
  const float* wo_a = args.wo_a.ptr<const float>();
  const float* wo_b = args.wo_b.ptr<const float>();
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t position = read_index(args.positions, t);
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      double* row = o.data() + h * kHeadDim;
      load_floats(args.o, t * args.o.stride[0] + h * args.o.stride[1], kHeadDim, row);
      rotate_f64(row + V4Fp8Format::kNopeDim, *args.rope, position, RopeDirection::kInverse);
    }
    for (std::int64_t g = 0; g < shape.groups; ++g) {
      for (std::int64_t k = 0; k < shape.rank; ++k) {
        const float* w = wo_a + (g * shape.rank + k) * group_width;
        double sum = 0.0;
        for (std::int64_t i = 0; i < group_width; ++i) sum += static_cast<double>(w[i]) * o[static_cast<std::size_t>(g * group_width + i)];
        z[static_cast<std::size_t>(g * shape.rank + k)] = sum;
      }
    }
    float* out = args.out.ptr<float>() + t * args.out.stride[0];
    const std::int64_t z_width = shape.groups * shape.rank;
    for (std::int64_t n = 0; n < shape.hidden; ++n) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < z_width; ++k) sum += static_cast<double>(wo_b[n * z_width + k]) * z[static_cast<std::size_t>(k)];
      out[n] = static_cast<float>(sum);
    }
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
