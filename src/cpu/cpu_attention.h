// Internal: the CPU backend's attention ops (arguments already validated).
#pragma once

#include "smla/attention.h"
#include "src/core/attention_validate.h"

namespace smla::cpu {

// Decode, and prefill read directly from the paged FP8 caches: every query
// token is a row with its own index lists, no bf16 staging copy.
Status sparse_decode(const SparseDecodeArgs& args, const detail::DecodeShape& shape);
// Prefill over the flat bf16 workspace.
Status sparse_prefill(const SparsePrefillArgs& args, const detail::PrefillShape& shape);

}  // namespace smla::cpu
