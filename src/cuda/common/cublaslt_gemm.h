// Internal: a small cuBLASLt wrapper for the row-major GEMMs of the CUDA layer
// ops and the model runner (projections, the grouped output projection).
//
//   out[b][M, N] = A[b][M, K] . B[b][N, K]^T      for b in [0, batch)
//
// Row-major operands with caller-chosen leading dimensions (elements between
// rows) and, for batch > 1, batch strides (elements between consecutive
// matrices; 0 reuses one matrix for every batch). Accumulation is f32; beta = 0
// (out is overwritten, never read).
//
// Types (A and B always share one dtype):
//   A/B f32  -> out f32   true f32 math (CUBLAS_COMPUTE_32F, TF32 never used);
//   A/B bf16 -> out f32 or bf16   tensor cores, f32 accumulation, out rounded once.
// Other combinations return InvalidArgument.
//
// Handles: one cuBLASLt handle per CUDA device, created on the first call on
// that device (thread-safe) and kept for the life of the process. The first
// call on a device must therefore not be inside CUDA graph capture; later calls
// only enqueue the matmul and are capture-safe (descriptor setup and the
// heuristic query are host-only). No allocation: cuBLASLt scratch is the
// caller's `workspace` (kCublasLtWorkspaceBytes recommended; smaller works, with
// fewer algorithms, 0 allowed). Pointer alignment is measured on every call and
// passed to the heuristic, so any element-aligned pointers and strides work.
//
// Errors come back as smla::Status: InvalidArgument naming the argument for bad
// shapes, strides or dtypes; Internal naming the cuBLASLt call and status.
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/dtype.h"
#include "smla/status.h"

namespace smla::cuda {

// Scratch recommended for cuBLASLt on Hopper (NVIDIA's guidance: 32 MiB).
inline constexpr std::size_t kCublasLtWorkspaceBytes = std::size_t{32} << 20;

struct GemmArgs {
  std::int64_t m = 0, n = 0, k = 0;
  int batch = 1;

  DType input_dtype = DType::kF32;  // of A and B: kF32 or kBF16
  const void* a = nullptr;          // [M, K], row m at a + m * lda
  std::int64_t lda = 0;             // >= K
  std::int64_t batch_stride_a = 0;
  const void* b = nullptr;  // [N, K], row n at b + n * ldb
  std::int64_t ldb = 0;     // >= K
  std::int64_t batch_stride_b = 0;

  DType out_dtype = DType::kF32;  // kF32, or kBF16 with bf16 inputs
  void* out = nullptr;            // [M, N], row m at out + m * ldc
  std::int64_t ldc = 0;           // >= N
  std::int64_t batch_stride_out = 0;

  void* workspace = nullptr;  // device scratch for cuBLASLt (may be nullptr with 0 bytes)
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;  // cudaStream_t (nullptr = legacy default stream)
};

// Enqueues the GEMM on args.stream of the current device. M, N or K == 0, or
// batch == 0: nothing to do (K == 0 with M, N > 0 is rejected: out would need
// zero-filling that cuBLASLt does not promise).
Status cublaslt_gemm(const GemmArgs& args);

}  // namespace smla::cuda
