// Running an attention op on any backend from host-side arguments, timed.
//
// The CLI builds and loads every tensor in host memory. For the cuda backend
// the arguments are copied to the current device byte for byte (strides,
// padding and poisoned outputs included), the op runs there, and the outputs
// are copied back into the host outputs of `args`.
#pragma once

#include <vector>

#include "smla/attention.h"
#include "smla/backend.h"
#include "smla/status.h"

namespace smla::cli {

// Calls the op `repeat` times (>= 1) and appends the wall time of each call
// (synchronized with the device for cuda) to *seconds. Stops at the first error.
Status run_sparse_decode(const SparseDecodeArgs& args, Backend backend, int repeat, std::vector<double>* seconds);
Status run_sparse_prefill(const SparsePrefillArgs& args, Backend backend, int repeat, std::vector<double>* seconds);

}  // namespace smla::cli
