// The cuBLASLt GEMM wrapper (cublaslt_gemm.h). Row-major out = A . B^T is the
// column-major product out^T = B . A^T, so B goes in cuBLASLt's first slot
// (transposed: "TN"), A in the second, and out keeps its layout.
#include "src/cuda/common/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace smla::cuda {
namespace {

Status lt_error(const char* call, cublasStatus_t status) {
  return internal_error(
      fmt::format("cublaslt_gemm: {} failed: {} ({})", call, cublasLtGetStatusName(status), static_cast<int>(status)));
}

#define SMLA_LT_CHECK(call)                                                                \
  do {                                                                                     \
    const cublasStatus_t smla_lt_status_ = (call);                                         \
    if (smla_lt_status_ != CUBLAS_STATUS_SUCCESS) return lt_error(#call, smla_lt_status_); \
  } while (0)

// The handle of the current device, created once (see the header about graph capture).
Expected<cublasLtHandle_t> device_handle() {
  int device = 0;
  const cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) {
    return internal_error(fmt::format("cublaslt_gemm: cudaGetDevice failed: {}", cudaGetErrorString(error)));
  }
  static std::mutex mutex;
  static std::map<int, cublasLtHandle_t> handles;  // intentionally never destroyed (process lifetime)
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  SMLA_LT_CHECK(cublasLtCreate(&handle));
  handles.emplace(device, handle);
  return handle;
}

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublasLtMatrixLayoutDestroy(d); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (<= 256) dividing the address and every byte step from it.
std::uint32_t alignment_of(const void* pointer, std::int64_t ld_bytes, std::int64_t batch_stride_bytes) {
  std::uint64_t bits = reinterpret_cast<std::uintptr_t>(pointer) | static_cast<std::uint64_t>(ld_bytes) |
                       static_cast<std::uint64_t>(batch_stride_bytes) | 256u;
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

// A column-major rows x cols layout with leading dimension ld, batched.
Expected<Layout> make_layout(DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t ld, int batch,
                             std::int64_t batch_stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  SMLA_LT_CHECK(cublasLtMatrixLayoutCreate(&raw, cuda_type(dtype), static_cast<std::uint64_t>(rows),
                                           static_cast<std::uint64_t>(cols), ld));
  Layout layout(raw);
  if (batch > 1) {
    SMLA_LT_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    SMLA_LT_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                   sizeof batch_stride));
  }
  return layout;
}

Status validate(const GemmArgs& args) {
  if (args.m < 0 || args.n < 0 || args.k < 0) {
    return invalid_argument("m/n/k", "non-negative extents", fmt::format("{}/{}/{}", args.m, args.n, args.k));
  }
  if (args.batch < 0) return invalid_argument("batch", ">= 0", std::to_string(args.batch));
  if (args.input_dtype != DType::kF32 && args.input_dtype != DType::kBF16) {
    return invalid_argument("input_dtype", "f32 or bf16", dtype_name(args.input_dtype));
  }
  const bool out_ok =
      args.out_dtype == DType::kF32 || (args.out_dtype == DType::kBF16 && args.input_dtype == DType::kBF16);
  if (!out_ok) {
    return invalid_argument("out_dtype",
                            fmt::format("f32{}", args.input_dtype == DType::kBF16 ? " or bf16" : " (f32 inputs)"),
                            dtype_name(args.out_dtype));
  }
  if (args.lda < args.k || args.lda < 1)
    return invalid_argument("lda", fmt::format(">= max(K, 1) = {}", args.k), std::to_string(args.lda));
  if (args.ldb < args.k || args.ldb < 1)
    return invalid_argument("ldb", fmt::format(">= max(K, 1) = {}", args.k), std::to_string(args.ldb));
  if (args.ldc < args.n || args.ldc < 1)
    return invalid_argument("ldc", fmt::format(">= max(N, 1) = {}", args.n), std::to_string(args.ldc));
  if (args.batch_stride_a < 0 || args.batch_stride_b < 0 || args.batch_stride_out < 0) {
    return invalid_argument("batch strides", "non-negative",
                            fmt::format("{}/{}/{}", args.batch_stride_a, args.batch_stride_b, args.batch_stride_out));
  }
  if (args.batch > 1 && args.m > 0 && args.n > 0) {
    // Output matrices must not overlap: stacked (one after another) or side by side within each row.
    const bool stacked = args.batch_stride_out >= (args.m - 1) * args.ldc + args.n;
    const bool side_by_side =
        args.batch_stride_out >= args.n && (args.batch - 1) * args.batch_stride_out + args.n <= args.ldc;
    if (!stacked && !side_by_side) {
      return invalid_argument("batch_stride_out", "non-overlapping output matrices",
                              std::to_string(args.batch_stride_out));
    }
  }
  if (args.k == 0 && args.m > 0 && args.n > 0 && args.batch > 0) {
    return invalid_argument("k", ">= 1 (K = 0 would leave out unwritten)", "0");
  }
  if (args.workspace_bytes > 0 &&
      (args.workspace == nullptr || reinterpret_cast<std::uintptr_t>(args.workspace) % 256 != 0)) {
    return invalid_argument("workspace", "a 256-byte aligned device pointer", fmt::format("{}", args.workspace));
  }
  return Status::Ok();
}

}  // namespace

Status cublaslt_gemm(const GemmArgs& args) {
  SMLA_RETURN_IF_ERROR(validate(args));
  if (args.m == 0 || args.n == 0 || args.batch == 0) return Status::Ok();
  if (args.a == nullptr || args.b == nullptr || args.out == nullptr) {
    return invalid_argument("a/b/out", "non-null device pointers", "nullptr");
  }
  auto handle = device_handle();
  if (!handle) return handle.status();

  cublasLtMatmulDesc_t raw_desc = nullptr;
  SMLA_LT_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  SMLA_LT_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  SMLA_LT_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));

  // cuBLASLt A = our B (K x N column-major, transposed), cuBLASLt B = our A (K x M), C = D = out^T (N x M).
  auto layout_b = make_layout(args.input_dtype, args.k, args.n, args.ldb, args.batch, args.batch_stride_b);
  if (!layout_b) return layout_b.status();
  auto layout_a = make_layout(args.input_dtype, args.k, args.m, args.lda, args.batch, args.batch_stride_a);
  if (!layout_a) return layout_a.status();
  auto layout_out = make_layout(args.out_dtype, args.n, args.m, args.ldc, args.batch, args.batch_stride_out);
  if (!layout_out) return layout_out.status();

  cublasLtMatmulPreference_t raw_pref = nullptr;
  SMLA_LT_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  const std::uint64_t max_workspace = args.workspace_bytes;
  SMLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                     sizeof max_workspace));
  const std::int64_t in_size = static_cast<std::int64_t>(dtype_size(args.input_dtype));
  const std::int64_t out_size = static_cast<std::int64_t>(dtype_size(args.out_dtype));
  const bool batched = args.batch > 1;
  const std::uint32_t align_first =
      alignment_of(args.b, args.ldb * in_size, batched ? args.batch_stride_b * in_size : 0);
  const std::uint32_t align_second =
      alignment_of(args.a, args.lda * in_size, batched ? args.batch_stride_a * in_size : 0);
  const std::uint32_t align_out =
      alignment_of(args.out, args.ldc * out_size, batched ? args.batch_stride_out * out_size : 0);
  SMLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first,
                                                     sizeof align_first));
  SMLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                     &align_second, sizeof align_second));
  SMLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_out,
                                                     sizeof align_out));
  SMLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_out,
                                                     sizeof align_out));

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  SMLA_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(*handle, raw_desc, layout_b->get(), layout_a->get(), layout_out->get(),
                                               layout_out->get(), raw_pref, 1, &heuristic, &found));
  if (found < 1) {
    return internal_error(fmt::format("cublaslt_gemm: no cuBLASLt algorithm for M={} N={} K={} batch={} {} -> {}",
                                      args.m, args.n, args.k, args.batch, dtype_name(args.input_dtype),
                                      dtype_name(args.out_dtype)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  SMLA_LT_CHECK(cublasLtMatmul(*handle, raw_desc, &alpha, args.b, layout_b->get(), args.a, layout_a->get(), &beta,
                               args.out, layout_out->get(), args.out, layout_out->get(), &heuristic.algo,
                               args.workspace, args.workspace_bytes, static_cast<cudaStream_t>(args.stream)));
  return Status::Ok();
}

}  // namespace smla::cuda
