// Internal: the function table behind the Op::kStepMetadata registry rows
// (smla/registry.h). The host rows (reference, cpu) run the host forms of
// smla/metadata.h; the cuda row (src/cuda/metadata) the device forms. The
// Context forms of smla/metadata.h select a row and call through it; each
// implementation does its own checks (the host ones read values, the device
// ones never do), so the table takes the public arguments unchanged.
#pragma once

#include <cstdint>

#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/metadata.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::metadata_detail {

struct MetadataFunctions {
  Status (*build_step_metadata)(const Context&, const BatchDescription&, const StepConfig&,
                                const StepMetadataBuffers&, const TensorView& counts) = nullptr;
  Status (*c4a_global_topk_indices)(const Context&, const TensorView& local_topk, const TensorView& token_to_req,
                                    const TensorView& is_valid_token, const TensorView& block_table,
                                    std::int64_t block_size, const TensorView& global_out,
                                    const TensorView& lens_out) = nullptr;
  Status (*v32_request_to_global_indices)(const Context&, const TensorView& req_indices, const TensorView& req_id,
                                          const TensorView& block_table, std::int64_t block_size,
                                          std::int64_t block_stride_rows, const TensorView& out,
                                          const TensorView& valid_counts) = nullptr;
  Status (*mixed_sparse_indices)(const Context&, const BatchDescription&, const StepConfig&, int compress_ratio,
                                 const TensorView& c4a_local_topk, const TensorView& out_indices,
                                 const TensorView& out_lens) = nullptr;
  Status (*dequantize_and_gather)(const Context&, const KvCacheView& cache, const TensorView& seq_lens,
                                  const TensorView& gather_lens, const TensorView& block_table, std::int64_t offset,
                                  const TensorView& out) = nullptr;
  Status (*combine_topk_swa_indices)(const Context&, const BatchDescription&, const StepConfig&, int compress_ratio,
                                     const PrefillChunk& chunk, std::int64_t compressed_rows,
                                     std::int64_t workspace_rows, const TensorView& topk,
                                     const TensorView& out_indices, const TensorView& out_lens) = nullptr;
  Status (*gather_prefill_chunk)(const Context&, const BatchDescription&, const StepConfig&, int compress_ratio,
                                 const PrefillChunk& chunk, std::int64_t compressed_rows,
                                 const KvCacheView& swa_cache, const KvCacheView& compressed_cache,
                                 const TensorView& out) = nullptr;
};

}  // namespace smla::metadata_detail

namespace smla::metadata_cuda {

// The cuda row's table (src/cuda/metadata/cuda_metadata_api.cc; CUDA builds only).
extern const metadata_detail::MetadataFunctions kFunctions;

}  // namespace smla::metadata_cuda
