// Builds without nvcc keep the device metadata entry points so programs link and get a clear error.
#include "smla/cuda_metadata.h"

namespace smla {

namespace {
Status cuda_not_built() { return unimplemented("the CUDA backend was not built (nvcc not found or SMLA_ENABLE_CUDA=OFF)"); }
}  // namespace

Status cuda_build_step_metadata(const BatchDescription&, const StepConfig&, const StepMetadataBuffers&,
                                const TensorView&, void*) {
  return cuda_not_built();
}
Status cuda_c4a_global_topk_indices(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                                    std::int64_t, const TensorView&, const TensorView&, void*) {
  return cuda_not_built();
}
Status cuda_v32_request_to_global_indices(const TensorView&, const TensorView&, const TensorView&, std::int64_t,
                                          std::int64_t, const TensorView&, const TensorView&, void*) {
  return cuda_not_built();
}
Status cuda_mixed_sparse_indices(const BatchDescription&, const StepConfig&, int, const TensorView&,
                                 const TensorView&, const TensorView&, void*) {
  return cuda_not_built();
}
Status cuda_dequantize_and_gather(const KvCacheView&, const TensorView&, const TensorView&, const TensorView&,
                                  std::int64_t, const TensorView&, void*) {
  return cuda_not_built();
}
Status cuda_combine_topk_swa_indices(const BatchDescription&, const StepConfig&, int, PrefillChunk, std::int64_t,
                                     std::int64_t, const TensorView&, const TensorView&, const TensorView&, void*) {
  return cuda_not_built();
}
Status cuda_gather_prefill_chunk(const BatchDescription&, const StepConfig&, int, PrefillChunk, std::int64_t,
                                 const KvCacheView&, const KvCacheView&, const TensorView&, void*) {
  return cuda_not_built();
}

}  // namespace smla
