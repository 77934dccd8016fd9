#include "src/core/attention_validate.h"

namespace smla::detail {

Expected<DecodeShape> validate_sparse_decode(const SparseDecodeArgs&, DeviceKind) {
  return unimplemented("validate_sparse_decode");
}
Expected<PrefillShape> validate_sparse_prefill(const SparsePrefillArgs&, DeviceKind) {
  return unimplemented("validate_sparse_prefill");
}

}  // namespace smla::detail
