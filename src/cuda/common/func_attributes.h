// Internal: a kernel's dynamic shared-memory limit, set once per (kernel, device).
#pragma once

#include <cuda_runtime_api.h>

namespace smla::cuda {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) on the current device, skipped
// when an earlier call already allowed at least `bytes` there: the attribute call costs
// microseconds of host time, which every decode launch would otherwise pay.
cudaError_t ensure_dynamic_smem(const void* kernel, int bytes);

template <class Kernel>
cudaError_t ensure_dynamic_smem(Kernel* kernel, int bytes) {
  return ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// cudaFuncSetAttribute(kernel, NonPortableClusterSizeAllowed, 1) on the current
// device, once per (kernel, device): clusters of more than 8 CTAs (up to 16 on
// Hopper) launch only with it.
cudaError_t ensure_large_clusters(const void* kernel);

template <class Kernel>
cudaError_t ensure_large_clusters(Kernel* kernel) {
  return ensure_large_clusters(reinterpret_cast<const void*>(kernel));
}

}  // namespace smla::cuda
