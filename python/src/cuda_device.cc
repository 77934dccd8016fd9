#include <fmt/format.h>

#include <map>
#include <utility>

#include "python/src/bindings.h"

#if defined(SMLA_HAS_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace smla::python {

Status switch_device(int device, int* previous) {
#if defined(SMLA_HAS_CUDA)
  int current = 0;
  cudaError_t error = cudaGetDevice(&current);
  if (error == cudaSuccess && current != device) {
    error = cudaSetDevice(device);
    if (error == cudaSuccess && previous != nullptr) *previous = current;
  }
  if (error != cudaSuccess) {
    cudaGetLastError();
    return internal_error(fmt::format("cuda: selecting device {} failed: {}", device, cudaGetErrorString(error)));
  }
#else
  (void)device;
  (void)previous;
#endif
  return Status::Ok();
}

namespace {

int current_device_or_host(Backend backend) {
#if defined(SMLA_HAS_CUDA)
  int device = 0;
  if (backend == Backend::kCuda && cudaGetDevice(&device) == cudaSuccess) return device;
  cudaGetLastError();
#else
  (void)backend;
#endif
  return -1;
}

}  // namespace

Expected<Context*> thread_context(Backend backend) {
  thread_local std::map<std::pair<Backend, int>, Context> contexts;
  const auto key = std::make_pair(backend, current_device_or_host(backend));
  if (auto found = contexts.find(key); found != contexts.end()) return &found->second;
  auto created = Context::create(backend);
  if (!created) return created.status();
  return &contexts.emplace(key, std::move(*created)).first->second;
}

}  // namespace smla::python
