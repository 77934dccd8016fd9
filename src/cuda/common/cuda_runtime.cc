// The CUDA backend's part of Context (src/runtime/registry_internal.h): the
// current device's properties, read once per device, and scratch memory.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <map>
#include <mutex>

#include "src/runtime/registry_internal.h"

namespace smla::runtime {
namespace {

Status cuda_error(const char* what, cudaError_t error) {
  return internal_error(fmt::format("cuda: {} failed: {}", what, cudaGetErrorString(error)));
}

Expected<DeviceProperties> read_properties(int ordinal) {
  DeviceProperties device;
  device.ordinal = ordinal;
  int major = 0;
  int minor = 0;
  cudaError_t error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&device.multiprocessors, cudaDevAttrMultiProcessorCount, ordinal);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&device.shared_memory_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal);
  }
  cudaDeviceProp props{};
  if (error == cudaSuccess) error = cudaGetDeviceProperties(&props, ordinal);
  if (error != cudaSuccess) return cuda_error("reading the device properties", error);
  device.compute_capability = major * 10 + minor;
  device.name = props.name;
  return device;
}

Expected<DeviceProperties> current_cuda_device() {
  static std::mutex mutex;
  static std::map<int, DeviceProperties> known;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clears the error a failed count leaves behind
    return unimplemented("cuda: no CUDA device is present on this machine");
  }
  int ordinal = 0;
  const cudaError_t error = cudaGetDevice(&ordinal);
  if (error != cudaSuccess) return cuda_error("cudaGetDevice", error);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = known.find(ordinal); found != known.end()) return found->second;
  auto device = read_properties(ordinal);
  if (!device) return device.status();
  known.emplace(ordinal, *device);
  return device;
}

Expected<void*> cuda_allocate(std::size_t bytes) {
  void* data = nullptr;
  const cudaError_t error = cudaMalloc(&data, bytes);
  if (error != cudaSuccess) {
    return internal_error(fmt::format("cuda: workspace allocation of {} bytes failed: {}", bytes, cudaGetErrorString(error)));
  }
  return data;
}

void cuda_release(void* data) { cudaFree(data); }  // cudaFree waits for work still using it

}  // namespace

const BackendRuntime* cuda_runtime() {
  static const BackendRuntime hooks{&current_cuda_device, &cuda_allocate, &cuda_release};
  return &hooks;
}

}  // namespace smla::runtime
