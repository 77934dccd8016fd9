// kCpu: inverse RoPE then the grouped low-rank projection with OpenBLAS sgemm.
//
// The inverse RoPE copy runs tokens in parallel on the CPU backend's thread
// pool; the GEMMs stay in OpenBLAS (its own threads).
#include <cblas.h>

#include <vector>

#include "src/cpu/thread_pool.h"
#include "src/core/strided_access.h"
#include "src/cpu/layer/rope_f32.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {

Status project_output_f32(const OutputProjectionArgs& args, const OutputShape& shape) {
  constexpr int kHeadDim = V4Fp8Format::kHeadDim;
  const std::int64_t width = shape.heads * kHeadDim;  // o row: all heads
  const std::int64_t group_width = width / shape.groups;
  std::vector<float> o(static_cast<std::size_t>(shape.tokens * width));
  cpu::parallel_for(shape.tokens, [&](std::int64_t t, int) {
    const float* cos_sin = args.rope->row(read_index(args.positions, t));
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      float* row = o.data() + t * width + h * kHeadDim;
      load_floats(args.o, t * args.o.stride[0] + h * args.o.stride[1], kHeadDim, row);
      rotate_f32(row + V4Fp8Format::kNopeDim, cos_sin, RopeDirection::kInverse);
    }
  });
  const std::int64_t z_width = shape.groups * shape.rank;
  std::vector<float> z(static_cast<std::size_t>(shape.tokens * z_width));
  if (shape.tokens == 0) return Status::Ok();
  if (args.row_stable) {
    for (std::int64_t t = 0; t < shape.tokens; ++t) {
      for (std::int64_t g = 0; g < shape.groups; ++g) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(shape.rank), static_cast<int>(group_width), 1.0f,
                    args.wo_a.ptr<const float>() + g * shape.rank * group_width, static_cast<int>(group_width),
                    o.data() + t * width + g * group_width, 1, 0.0f, z.data() + t * z_width + g * shape.rank, 1);
      }
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(shape.hidden), static_cast<int>(z_width), 1.0f,
                  args.wo_b.ptr<const float>(), static_cast<int>(z_width), z.data() + t * z_width, 1, 0.0f,
                  args.out.ptr<float>() + t * args.out.stride[0], 1);
    }
    return Status::Ok();
  }
  for (std::int64_t g = 0; g < shape.groups; ++g) {
    // z[:, g] = o[:, g heads] . wo_a[g]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(shape.tokens), static_cast<int>(shape.rank),
                static_cast<int>(group_width), 1.0f, o.data() + g * group_width, static_cast<int>(width),
                args.wo_a.ptr<const float>() + g * shape.rank * group_width, static_cast<int>(group_width), 0.0f,
                z.data() + g * shape.rank, static_cast<int>(z_width));
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(shape.tokens), static_cast<int>(shape.hidden),
              static_cast<int>(z_width), 1.0f, z.data(), static_cast<int>(z_width), args.wo_b.ptr<const float>(),
              static_cast<int>(z_width), 0.0f, args.out.ptr<float>(), static_cast<int>(args.out.stride[0]));
  return Status::Ok();
}

}  // namespace smla::layer_detail
