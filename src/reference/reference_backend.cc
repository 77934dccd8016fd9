#include "src/core/backend_ops.h"
#include "src/reference/reference_ops.h"

namespace smla::detail {

const BackendOps* reference_backend_ops() {
  static const BackendOps ops{Backend::kReference, &reference::sparse_decode, &reference::sparse_prefill};
  return &ops;
}

}  // namespace smla::detail
