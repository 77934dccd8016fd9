// The model step's small ops: host implementations and the one backend dispatch.
#include "src/runtime/model/model_kernels.h"

#include <cblas.h>
#include <fmt/format.h>

#include <cmath>

#include "smla/numeric.h"
#include "src/cuda/common/cublaslt_gemm.h"

namespace smla::model_detail {
namespace {

Status host_linear(const LinearArgs& a) {
  if (a.rows == 0) return Status::Ok();
  const auto* in = static_cast<const float*>(a.in);
  const auto* w = static_cast<const float*>(a.weight);
  const int n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  if (a.row_stable) {
    for (std::int64_t r = 0; r < a.rows; ++r) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, in + r * a.k, 1, 0.0f, a.out + r * a.n, 1);
    }
    return Status::Ok();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.rows), n, k, 1.0f, in, k, w, k, 0.0f, a.out,
              n);
  return Status::Ok();
}

// Sum of squares in double, as the float64 reference would round it once.
Status host_row_norm(const RowNormArgs& a) {
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const std::int64_t base = r * a.width;
    auto value = [&](std::int64_t i) { return a.addend != nullptr ? a.in[base + i] + a.addend[base + i] : a.in[base + i]; };
    float scale = 1.0f;
    if (a.normalize) {
      double sum_squares = 0.0;
      for (std::int64_t i = 0; i < a.width; ++i) sum_squares += static_cast<double>(value(i)) * value(i);
      scale = static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(a.width) + a.eps));
    }
    for (std::int64_t i = 0; i < a.width; ++i) {
      float v = value(i);
      if (a.normalize) v *= scale * (a.weight != nullptr ? a.weight[i] : 1.0f);
      if (a.out_f32 != nullptr) a.out_f32[base + i] = v;
      if (a.out_gemm != nullptr) static_cast<float*>(a.out_gemm)[base + i] = v;
    }
  }
  return Status::Ok();
}

Status host_state_slots(const cuda_model::StateSlotParams& p) {
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    for (const auto& g : p.groups) {
      if (g.slots != nullptr) g.slots[t] = cuda_model::state_slot(p, g, t);
    }
  }
  return Status::Ok();
}

bool on_cuda(const Context& context) { return context.backend() == Backend::kCuda; }

#if !defined(SMLA_HAS_CUDA)
Status not_built() { return unimplemented("Model: the cuda backend is not built"); }
#endif

}  // namespace

DType gemm_dtype(const Context& context) { return on_cuda(context) ? DType::kBF16 : DType::kF32; }

Status linear(const Context& context, const LinearArgs& args) {
  if (!on_cuda(context)) return host_linear(args);
#if defined(SMLA_HAS_CUDA)
  return cuda_linear(context, args);
#else
  return not_built();
#endif
}

std::size_t linear_workspace_bytes(const Context& context) {
#if defined(SMLA_HAS_CUDA)
  if (on_cuda(context)) return cuda::kCublasLtWorkspaceBytes;
#endif
  (void)context;
  return 0;
}

Status row_norm(const Context& context, const RowNormArgs& args) {
  if (!on_cuda(context)) return host_row_norm(args);
#if defined(SMLA_HAS_CUDA)
  const std::int64_t w = args.width;
  const cuda_model::RowNormParams p{args.in,      w, args.addend, w, args.weight, args.out_f32, w,
                                    static_cast<std::uint16_t*>(args.out_gemm), w, args.rows, w, args.normalize,
                                    args.eps};
  return cuda_model::launch_row_norm(p, context.stream());
#else
  return not_built();
#endif
}

Status state_slots(const Context& context, const cuda_model::StateSlotParams& params) {
  if (!on_cuda(context)) return host_state_slots(params);
#if defined(SMLA_HAS_CUDA)
  return cuda_model::launch_state_slots(params, context.stream());
#else
  return not_built();
#endif
}

}  // namespace smla::model_detail
