// Placeholder until the CUDA implementation lands (issue 6).
#include "smla/cuda_layer.h"

namespace smla {

Status cuda_prepare_indexer_query(const IndexerQueryArgs&, void*) { return unimplemented("cuda_prepare_indexer_query: not implemented yet"); }

}  // namespace smla
