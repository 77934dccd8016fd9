#include "src/cuda/common/func_attributes.h"

#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace smla::cuda {

cudaError_t ensure_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> allowed;  // (kernel, device) -> bytes set
  std::lock_guard<std::mutex> lock(mutex);
  int& limit = allowed[{kernel, device}];
  if (limit >= bytes) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess) limit = bytes;
  return status;
}

cudaError_t ensure_large_clusters(const void* kernel) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> allowed;  // (kernel, device) set
  std::lock_guard<std::mutex> lock(mutex);
  if (allowed.count({kernel, device}) != 0) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (status == cudaSuccess) allowed.insert({kernel, device});
  return status;
}

}  // namespace smla::cuda
