// The model's projections GEMM on cuda: cuBLASLt, bf16 operands, f32 out.
#include "src/cuda/common/cublaslt_gemm.h"
#include "src/runtime/model/model_kernels.h"

namespace smla::model_detail {

Status cuda_linear(const Context& context, const LinearArgs& args) {
  cuda::GemmArgs g;
  g.m = args.rows;
  g.n = args.n;
  g.k = args.k;
  g.input_dtype = DType::kBF16;
  g.a = args.in;
  g.lda = args.k;
  g.b = args.weight;
  g.ldb = args.k;
  g.out_dtype = DType::kF32;
  g.out = args.out;
  g.ldc = args.n;
  g.workspace = args.workspace;
  g.workspace_bytes = args.workspace_bytes;
  g.stream = context.stream();
  return cuda::cublaslt_gemm(g);
}

}  // namespace smla::model_detail
