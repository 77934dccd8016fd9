#include "src/cpu/thread_pool.h"
#include "src/core/strided_access.h"
#include "src/cpu/layer/rope_f32.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {

// Tokens in parallel: every (token, head) rotation is independent.
Status apply_rope_f32(const RopeArgs& args, const RopeShape& shape) {
  float* base = args.x.ptr<float>();
  cpu::parallel_for(shape.tokens, [&](std::int64_t t, int) {
    const float* cos_sin = args.table->row(read_index(args.positions, t));
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      rotate_f32(base + t * shape.stride_token + h * shape.stride_head + args.rope_offset, cos_sin, args.direction);
    }
  });
  return Status::Ok();
}

}  // namespace smla::layer_detail
