// Placeholder until the CUDA implementation lands (issue 6).
#include "smla/cuda_layer.h"

namespace smla {

Status cuda_prepare_query(const QueryPrepArgs&, void*) { return unimplemented("cuda_prepare_query: not implemented yet"); }
Status cuda_prepare_kv(const KvPrepArgs&, void*) { return unimplemented("cuda_prepare_kv: not implemented yet"); }

}  // namespace smla
