// The cuda row of project_output (smla/layer.h): inverse RoPE copy of the attention
// output into scratch, then two cuBLASLt GEMMs:
//   z[t, g*rank:(g+1)*rank] = o_rot[t, g heads] . wo_a[g]^T   (strided-batched over the G groups)
//   out[t] = z[t] . wo_b^T
// f32 weights: o_rot and z in f32, true f32 GEMMs (no TF32). bf16 weights: o_rot
// and z rounded to bf16 (tensor cores, f32 accumulation), out f32.
//
// Workspace (256-byte aligned pieces): o_rot [T, H*512], z [T, G*rank] in the
// GEMM dtype, then kCublasLtWorkspaceBytes for cuBLASLt.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>

#include "smla/kv_format.h"
#include "src/cuda/common/cublaslt_gemm.h"
#include "src/cuda/common/current_device.h"
#include "src/cuda/common/workspace_align.h"
#include "src/cuda/layer/output_projection_kernels.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {
namespace {

constexpr std::int64_t kHeadDim = V4Fp8Format::kHeadDim;

using layer_cuda::OutputShape;

struct WorkspaceLayout {
  std::size_t rotated_offset = 0, z_offset = 0, cublas_offset = 0, total = 0;
};

// f32 weights: f32 GEMMs; bf16 weights: bf16 o_rot and z (tensor cores).
DType gemm_dtype(const OutputProjectionArgs& args) { return args.wo_a.dtype; }

WorkspaceLayout workspace_layout(const OutputProjectionArgs& args, const OutputShape& shape) {
  const std::size_t element = dtype_size(gemm_dtype(args));
  WorkspaceLayout layout;
  layout.z_offset = cuda::align_workspace(static_cast<std::size_t>(shape.tokens * shape.heads * kHeadDim) * element);
  layout.cublas_offset =
      layout.z_offset + cuda::align_workspace(static_cast<std::size_t>(shape.tokens * shape.groups * shape.rank) * element);
  layout.total = layout.cublas_offset + cuda::kCublasLtWorkspaceBytes;
  return layout;
}

Status check_same_device(const TensorView& first, const TensorView& other, std::string_view name) {
  if (other.device.index != first.device.index) {
    return invalid_argument(name, fmt::format("a tensor on cuda:{} (the device of o)", first.device.index),
                            other.describe());
  }
  return Status::Ok();
}

// The device-only checks (the front end checked shapes and dtypes): GEMM
// row strides, every tensor on o's device, the current one.
Status check_launch(const Context& context, const OutputProjectionArgs& args, const OutputShape& shape) {
  if (shape.tokens > 1 && args.out.stride[0] < shape.hidden) {
    return invalid_argument("out", fmt::format("a row stride >= {} (hidden)", shape.hidden), args.out.describe());
  }
  for (const auto& [view, name] : {std::pair{&args.positions, "positions"}, std::pair{&args.wo_a, "wo_a"},
                                   std::pair{&args.wo_b, "wo_b"}, std::pair{&args.out, "out"}}) {
    SMLA_RETURN_IF_ERROR(check_same_device(args.o, *view, name));
  }
  return ::smla::cuda::check_on_context_device(context, args.o.device.index, "o");
}

// The inverse RoPE copy of o into the workspace (o_rot, in the GEMM dtype).
Status rotate_back(const OutputProjectionArgs& args, const OutputShape& shape, void* rotated, void* stream) {
  layer_cuda::InverseRopeParams rope;
  rope.o = args.o.data;
  rope.o_bf16 = args.o.dtype == DType::kBF16;
  rope.stride_o_t = args.o.stride[0];
  rope.stride_o_h = args.o.stride[1];
  rope.positions = args.positions.data;
  rope.positions_i64 = args.positions.dtype == DType::kI64;
  rope.stride_positions = args.positions.stride[0];
  rope.max_positions = args.rope->max_positions();
  for (int p = 0; p < kRopePairs; ++p) rope.inv_freq[p] = args.rope->inverse_frequencies()[static_cast<std::size_t>(p)];
  rope.out = rotated;
  rope.out_bf16 = gemm_dtype(args) == DType::kBF16;
  rope.tokens = shape.tokens;
  rope.heads = shape.heads;
  const cudaError_t error = layer_cuda::launch_inverse_rope_copy(rope, static_cast<cudaStream_t>(stream));
  if (error != cudaSuccess) {
    return internal_error(fmt::format("inverse RoPE launch failed: {}", cudaGetErrorString(error)));
  }
  return Status::Ok();
}

// z = o_rot . wo_a^T per group, then out = z . wo_b^T.
Status gemms(const OutputProjectionArgs& args, const OutputShape& shape, std::uint8_t* base,
             const WorkspaceLayout& layout, void* stream) {
  void* rotated = base + layout.rotated_offset;
  void* z = base + layout.z_offset;
  const DType dtype = gemm_dtype(args);

  const std::int64_t group_width = shape.heads / shape.groups * kHeadDim;
  const std::int64_t z_width = shape.groups * shape.rank;
  // cuBLASLt's Hopper kernels store z with bulk (TMA) copies that compute-sanitizer's initcheck does not
  // see, so the wo_b GEMM's reads of z would be reported as uninitialized; clearing z first is cheap.
  const cudaError_t cleared =
      cudaMemsetAsync(z, 0, static_cast<std::size_t>(shape.tokens * z_width) * dtype_size(dtype),
                      static_cast<cudaStream_t>(stream));
  if (cleared != cudaSuccess)
    return internal_error(fmt::format("cudaMemsetAsync of z failed: {}", cudaGetErrorString(cleared)));
  cuda::GemmArgs grouped;
  grouped.m = shape.tokens;
  grouped.n = shape.rank;
  grouped.k = group_width;
  grouped.batch = static_cast<int>(shape.groups);
  grouped.input_dtype = dtype;
  grouped.a = rotated;
  grouped.lda = shape.heads * kHeadDim;
  grouped.batch_stride_a = group_width;
  grouped.b = args.wo_a.data;
  grouped.ldb = group_width;
  grouped.batch_stride_b = shape.rank * group_width;
  grouped.out_dtype = dtype;
  grouped.out = z;
  grouped.ldc = z_width;
  grouped.batch_stride_out = shape.rank;
  grouped.workspace = base + layout.cublas_offset;
  grouped.workspace_bytes = cuda::kCublasLtWorkspaceBytes;
  grouped.stream = stream;
  SMLA_RETURN_IF_ERROR(cuda::cublaslt_gemm(grouped).with_context("wo_a GEMM: "));

  cuda::GemmArgs final_gemm = grouped;
  final_gemm.n = shape.hidden;
  final_gemm.k = z_width;
  final_gemm.batch = 1;
  final_gemm.a = z;
  final_gemm.lda = z_width;
  final_gemm.batch_stride_a = 0;
  final_gemm.b = args.wo_b.data;
  final_gemm.ldb = z_width;
  final_gemm.batch_stride_b = 0;
  final_gemm.out_dtype = DType::kF32;
  final_gemm.out = args.out.data;
  final_gemm.ldc = shape.tokens > 1 ? args.out.stride[0] : shape.hidden;
  final_gemm.batch_stride_out = 0;
  return cuda::cublaslt_gemm(final_gemm).with_context("wo_b GEMM: ");
}

}  // namespace

Expected<std::size_t> layer_cuda::project_output_workspace_size(const Context& context, const OutputProjectionArgs& args,
                                                               const OutputShape& shape) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));  // the query rejects what the call would
  return workspace_layout(args, shape).total;
}

Status layer_cuda::project_output(const Context& context, const OutputProjectionArgs& args, const OutputShape& shape,
                                  void* workspace) {
  SMLA_RETURN_IF_ERROR(check_launch(context, args, shape));
  if (shape.tokens == 0 || shape.hidden == 0) return Status::Ok();
  auto* base = static_cast<std::uint8_t*>(workspace);
  const WorkspaceLayout layout = workspace_layout(args, shape);
  SMLA_RETURN_IF_ERROR(rotate_back(args, shape, base + layout.rotated_offset, context.stream()));
  return gemms(args, shape, base, layout, context.stream());
}

}  // namespace smla
