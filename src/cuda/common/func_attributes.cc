#include "src/cuda/common/func_attributes.h"

#include <map>
#include <mutex>
#include <tuple>

namespace smla::cuda {
namespace {

// cudaFuncSetAttribute(kernel, attribute, value) on the current device unless an
// earlier call there already set at least `value` (or `value` is 0, the unset default).
cudaError_t raise_func_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, cudaFuncAttribute>, int> set_values;
  std::lock_guard<std::mutex> lock(mutex);
  int& set_value = set_values[{kernel, device, attribute}];
  if (set_value >= value) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, attribute, value);
  if (status == cudaSuccess) set_value = value;
  return status;
}

}  // namespace

cudaError_t ensure_dynamic_smem(const void* kernel, int bytes) {
  return raise_func_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

cudaError_t ensure_large_clusters(const void* kernel) {
  return raise_func_attribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

}  // namespace smla::cuda
