#include "smla/backend.h"

#include <fmt/format.h>

#include "src/runtime/registry_internal.h"

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
  const runtime::BackendRuntime* hooks = runtime::backend_runtime(backend);
  return hooks != nullptr && hooks->current_device().ok();
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

}  // namespace smla
