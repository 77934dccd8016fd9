// CUDA backend registration. Kernels arrive with issue 6; until then the
// backend reports itself unavailable.
#include "src/core/backend_ops.h"

namespace smla::detail {

const BackendOps* cuda_backend_ops() { return nullptr; }

}  // namespace smla::detail
