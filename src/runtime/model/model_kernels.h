// Internal: the small ops the model step does besides the public ones (the
// projections GEMM, the row RMSNorms, the compressor-state slots), one entry
// each that runs on the context's backend: host loops / OpenBLAS for reference
// and cpu, cuBLASLt and the kernels of model/cuda for cuda. The dispatch on
// context.backend() lives in model_kernels.cc only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/context.h"
#include "smla/dtype.h"
#include "smla/status.h"
#include "src/runtime/model/cuda/cuda_model_kernels.h"

namespace smla::model_detail {

// The dtype of the GEMM operands (weights and the activations fed to them):
// f32 on the host backends, bf16 on cuda.
DType gemm_dtype(const Context& context);

// out[rows, n] = in[rows, k] . weight[n, k]^T, f32 out; in and weight in
// gemm_dtype(context), contiguous. row_stable (host): one sgemv per row, so
// results do not depend on how rows are batched. workspace: cuBLASLt scratch.
struct LinearArgs {
  const void* in = nullptr;
  const void* weight = nullptr;
  float* out = nullptr;
  std::int64_t rows = 0, n = 0, k = 0;
  bool row_stable = false;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};
Status linear(const Context& context, const LinearArgs& args);
// Scratch linear() wants (cuda: the cuBLASLt workspace; 0 on the host).
std::size_t linear_workspace_bytes(const Context& context);

// Per row of width `width`: v = in (+ addend); with normalize,
// v *= rsqrt(mean(v^2) + eps) (times weight when present); v is written to
// out_f32 (may alias in) and/or to out_gemm in gemm_dtype(context). Either
// output may be nullptr. Contiguous rows.
struct RowNormArgs {
  const float* in = nullptr;
  const float* addend = nullptr;
  const float* weight = nullptr;
  float* out_f32 = nullptr;
  void* out_gemm = nullptr;
  std::int64_t rows = 0, width = 0;
  bool normalize = true;
  float eps = 1e-6f;
};
Status row_norm(const Context& context, const RowNormArgs& args);

// The compressor-state slot of each token for both state groups
// (cuda_model::StateSlotParams), in the context's memory.
Status state_slots(const Context& context, const cuda_model::StateSlotParams& params);

// Device entries (model/cuda, CUDA builds only).
Status cuda_linear(const Context& context, const LinearArgs& args);

}  // namespace smla::model_detail
