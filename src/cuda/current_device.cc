#include "src/cuda/current_device.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace smla::cuda {

Expected<int> current_device() {
  int device = 0;
  const cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return internal_error(fmt::format("cuda: cudaGetDevice failed: {}", cudaGetErrorString(error)));
  return device;
}

Status check_on_current_device(int index, std::string_view name) {
  auto device = current_device();
  if (!device) return device.status();
  if (index != *device) {
    return invalid_argument(name, fmt::format("tensors on the current device cuda:{}", *device),
                            fmt::format("cuda:{}", index));
  }
  return Status::Ok();
}

Status check_on_current_device(std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors) {
  auto device = current_device();
  if (!device) return device.status();
  for (const auto& [tensor, name] : tensors) {
    if (tensor->present() && tensor->device.index != *device) {
      return invalid_argument(name, fmt::format("tensors on the current device cuda:{}", *device),
                              fmt::format("cuda:{}", tensor->device.index));
    }
  }
  return Status::Ok();
}

}  // namespace smla::cuda
