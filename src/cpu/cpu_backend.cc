// CPU backend registration. The SIMD kernels arrive with issue 5; until then
// the backend reports itself unavailable.
#include "src/core/backend_ops.h"

namespace smla::detail {

const BackendOps* cpu_backend_ops() { return nullptr; }

}  // namespace smla::detail
