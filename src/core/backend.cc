#include "smla/backend.h"

#include <fmt/format.h>

#include "smla/cuda.h"
#include "src/core/backend_ops.h"

namespace smla {

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kReference: return "reference";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

Expected<Backend> parse_backend(std::string_view name) {
  for (Backend b : {Backend::kAuto, Backend::kReference, Backend::kCpu, Backend::kCuda}) {
    if (backend_name(b) == name) return b;
  }
  return invalid_argument("backend", "one of auto, reference, cpu, cuda", fmt::format("'{}'", name));
}

bool backend_available(Backend backend) {
  if (backend == Backend::kAuto) return true;
  return detail::backend_ops(backend) != nullptr;
}

std::vector<Backend> available_backends() {
  std::vector<Backend> result;
  for (Backend b : {Backend::kReference, Backend::kCpu, Backend::kCuda}) {
    if (backend_available(b)) result.push_back(b);
  }
  return result;
}

Backend resolve_backend(Backend backend) {
  if (backend != Backend::kAuto) return backend;
  if (backend_available(Backend::kCuda)) return Backend::kCuda;
  if (backend_available(Backend::kCpu)) return Backend::kCpu;
  return Backend::kReference;
}

namespace detail {

const BackendOps* backend_ops(Backend backend) {
  switch (backend) {
    case Backend::kReference: return reference_backend_ops();
    case Backend::kCpu: return cpu_backend_ops();
    case Backend::kCuda: return cuda_backend_ops();
    case Backend::kAuto: return backend_ops(resolve_backend(backend));
  }
  return nullptr;
}

#if !defined(SMLA_HAS_CUDA)
const BackendOps* cuda_backend_ops() { return nullptr; }
#endif

}  // namespace detail

#if !defined(SMLA_HAS_CUDA)
// Builds without nvcc keep the CUDA entry points so programs link and get a clear error.
namespace {
Status cuda_not_built() { return unimplemented("the CUDA backend was not built (nvcc not found or SMLA_ENABLE_CUDA=OFF)"); }
}  // namespace

Expected<std::size_t> cuda_sparse_decode_workspace_size(const SparseDecodeArgs&) { return cuda_not_built(); }
Status cuda_sparse_decode(const SparseDecodeArgs&, void*, std::size_t, void*) { return cuda_not_built(); }
Expected<std::size_t> cuda_sparse_prefill_workspace_size(const SparsePrefillArgs&) { return cuda_not_built(); }
Status cuda_sparse_prefill(const SparsePrefillArgs&, void*, std::size_t, void*) { return cuda_not_built(); }
#endif

}  // namespace smla
