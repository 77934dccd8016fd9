// Placeholder until the CUDA implementation lands (issue 6).
#include "smla/cuda_layer.h"

namespace smla {

Expected<std::size_t> cuda_indexer_topk_workspace_size(const IndexerTopkArgs&) { return unimplemented("cuda_indexer_topk: not implemented yet"); }
Status cuda_indexer_topk(const IndexerTopkArgs&, void*, std::size_t, void*) { return unimplemented("cuda_indexer_topk: not implemented yet"); }

}  // namespace smla
