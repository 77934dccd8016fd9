// Internal: the table of operations a backend implements. Public entry points
// validate their arguments once (attention_validate.h) and then call through
// this table, so backends receive checked arguments and the derived shape.
#pragma once

#include "smla/attention.h"
#include "smla/backend.h"
#include "src/core/attention_validate.h"

namespace smla::detail {

struct BackendOps {
  Backend backend;
  // May be nullptr: the op is then reported as Unimplemented for this backend.
  Status (*sparse_decode)(const SparseDecodeArgs& args, const DecodeShape& shape) = nullptr;
  Status (*sparse_prefill)(const SparsePrefillArgs& args, const PrefillShape& shape) = nullptr;
};

// Each backend defines its table; cpu and cuda may return nullptr when not compiled
// in (cuda also when no device is present).
const BackendOps* reference_backend_ops();
const BackendOps* cpu_backend_ops();
const BackendOps* cuda_backend_ops();

const BackendOps* backend_ops(Backend backend);  // nullptr when unavailable

}  // namespace smla::detail
