#include "src/core/strided_access.h"
#include "src/runtime/layer/layer_ops.h"
#include "src/reference/layer/rope_f64.h"

namespace smla::layer_detail {

Status apply_rope_f64(const RopeArgs& args, const RopeShape& shape) {
  float* base = args.x.ptr<float>();
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t position = read_index(args.positions, t);
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      float* x = base + t * shape.stride_token + h * shape.stride_head + args.rope_offset;
      double values[kRopeDim];
      for (int i = 0; i < kRopeDim; ++i) values[i] = x[i];
      rotate_f64(values, *args.table, position, args.direction);
      for (int i = 0; i < kRopeDim; ++i) x[i] = static_cast<float>(values[i]);
    }
  }
  return Status::Ok();
}

}  // namespace smla::layer_detail
