#include "src/core/backend_ops.h"

namespace smla::detail {

const BackendOps* reference_backend_ops() {
  static const BackendOps ops{Backend::kReference, nullptr, nullptr};
  return &ops;
}

}  // namespace smla::detail
