// Internal: the reference backend's implementations of the attention ops.
// They receive arguments already checked by src/core/attention_validate.h.
#pragma once

#include "src/core/attention_validate.h"

namespace smla::reference {

Status sparse_decode(const SparseDecodeArgs& args, const detail::DecodeShape& shape);
Status sparse_prefill(const SparsePrefillArgs& args, const detail::PrefillShape& shape);

}  // namespace smla::reference
