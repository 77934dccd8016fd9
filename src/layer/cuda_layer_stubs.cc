// Builds without nvcc keep the CUDA layer entry points so programs link and get a clear error.
#include "smla/cuda_layer.h"

namespace smla {

namespace {
Status cuda_not_built() { return unimplemented("the CUDA backend was not built (nvcc not found or SMLA_ENABLE_CUDA=OFF)"); }
}  // namespace

Status cuda_apply_rope(const RopeArgs&, void*) { return cuda_not_built(); }
Status cuda_prepare_query(const QueryPrepArgs&, void*) { return cuda_not_built(); }
Status cuda_prepare_kv(const KvPrepArgs&, void*) { return cuda_not_built(); }
Status cuda_run_compressor(const CompressorArgs&, void*) { return cuda_not_built(); }
Status cuda_prepare_indexer_query(const IndexerQueryArgs&, void*) { return cuda_not_built(); }
Expected<std::size_t> cuda_indexer_topk_workspace_size(const IndexerTopkArgs&) { return cuda_not_built(); }
Status cuda_indexer_topk(const IndexerTopkArgs&, void*, std::size_t, void*) { return cuda_not_built(); }
Expected<std::size_t> cuda_project_output_workspace_size(const OutputProjectionArgs&) { return cuda_not_built(); }
Status cuda_project_output(const OutputProjectionArgs&, void*, std::size_t, void*) { return cuda_not_built(); }

}  // namespace smla
