#include "src/cuda/sm90/sm90_tensor_map.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

namespace smla::cuda::sm90 {

static_assert(sizeof(CUtensorMap) == sizeof(SparseAttentionParams::q_tensor_map) &&
              alignof(CUtensorMap) <= alignof(SparseAttentionParams));

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not sticky; leave no error behind for the launch's check
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

void encode_query_tensor_map(SparseAttentionParams* p, int d_qk) {
  p->q_by_tensor_map = false;
  // 16-byte base and strides (q_aligned_16) are what the tensor map needs; a
  // broadcast (zero) stride is left to the consumers' loads.
  if (!p->q_aligned_16 || p->stride_q_h <= 0 || p->stride_q_t <= 0 || p->num_tokens <= 0 || p->num_heads <= 0) return;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return;
  constexpr cuuint32_t kBox = 64;  // 64 values (one 128-byte swizzle row) x 64 heads x 1 token
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d_qk), static_cast<cuuint64_t>(p->num_heads),
                              static_cast<cuuint64_t>(p->num_tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p->stride_q_h) * 2, static_cast<cuuint64_t>(p->stride_q_t) * 2};
  const cuuint32_t box[3] = {kBox, kBox, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  auto* map = reinterpret_cast<CUtensorMap*>(p->q_tensor_map);
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<std::uint16_t*>(p->q), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  p->q_by_tensor_map = result == CUDA_SUCCESS;
}

void encode_output_tensor_map(SparseAttentionParams* p, int box_rows) {
  p->out_by_tensor_map = false;
  if ((box_rows != 16 && box_rows != 64) || !p->out_aligned_16 || p->num_splits != 1 || p->head_block_rows != 64 ||
      p->stride_out_h <= 0 || p->stride_out_t <= 0 || p->num_tokens <= 0 || p->num_heads <= 0) {
    return;
  }
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return;
  const cuuint64_t dims[3] = {512, static_cast<cuuint64_t>(p->num_heads), static_cast<cuuint64_t>(p->num_tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p->stride_out_h) * 2,
                                 static_cast<cuuint64_t>(p->stride_out_t) * 2};
  // A warp's 16 rows or a warpgroup's 64, x one 128-byte swizzle row of values.
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  auto* map = reinterpret_cast<CUtensorMap*>(p->out_tensor_map);
  const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, p->out, dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  p->out_by_tensor_map = result == CUDA_SUCCESS;
  p->out_box_rows = box_rows;
}

}  // namespace smla::cuda::sm90
