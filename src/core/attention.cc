#include "smla/attention.h"

#include <fmt/format.h>

#include "src/core/backend_ops.h"

namespace smla {

namespace {

Expected<const detail::BackendOps*> ops_for(Backend requested) {
  const Backend backend = resolve_backend(requested);
  const detail::BackendOps* ops = detail::backend_ops(backend);
  if (ops == nullptr) {
    return unimplemented(fmt::format("backend '{}' is not available in this build or on this machine",
                                     backend_name(backend)));
  }
  return ops;
}

DeviceKind device_of(Backend backend) { return backend == Backend::kCuda ? DeviceKind::kCuda : DeviceKind::kCpu; }

}  // namespace

Status sparse_decode(const SparseDecodeArgs& args, Backend backend) {
  auto ops = ops_for(backend);
  if (!ops) return ops.status();
  auto shape = detail::validate_sparse_decode(args, device_of((*ops)->backend));
  if (!shape) return shape.status().with_context("sparse_decode: ");
  if ((*ops)->sparse_decode == nullptr) {
    return unimplemented(fmt::format("sparse_decode is not implemented by backend '{}'", backend_name((*ops)->backend)));
  }
  return (*ops)->sparse_decode(args, *shape);
}

Status sparse_prefill(const SparsePrefillArgs& args, Backend backend) {
  auto ops = ops_for(backend);
  if (!ops) return ops.status();
  auto shape = detail::validate_sparse_prefill(args, device_of((*ops)->backend));
  if (!shape) return shape.status().with_context("sparse_prefill: ");
  if ((*ops)->sparse_prefill == nullptr) {
    return unimplemented(fmt::format("sparse_prefill is not implemented by backend '{}'", backend_name((*ops)->backend)));
  }
  return (*ops)->sparse_prefill(args, *shape);
}

}  // namespace smla
