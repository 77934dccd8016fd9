#include <fmt/format.h>

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

}  // namespace smla::python
