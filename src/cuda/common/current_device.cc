#include "src/cuda/common/current_device.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace smla::cuda {

Expected<int> current_device() {
  int device = 0;
  const cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return internal_error(fmt::format("cuda: cudaGetDevice failed: {}", cudaGetErrorString(error)));
  return device;
}

Status check_on_device(int index, int current, std::string_view name) {
  if (index != current) {
    return invalid_argument(name, fmt::format("tensors on the current device cuda:{}", current),
                            fmt::format("cuda:{}", index));
  }
  return Status::Ok();
}

Expected<int> context_device(const Context& context) {
  if (context.validates_only()) return context.device().ordinal;
  auto current = current_device();
  if (!current) return current.status();
  if (*current != context.device().ordinal) {
    return invalid_argument("context", fmt::format("the current device cuda:{}", *current),
                            fmt::format("a context of cuda:{}", context.device().ordinal));
  }
  return current;
}

Status check_on_context_device(const Context& context, int index, std::string_view name) {
  auto device = context_device(context);
  if (!device) return device.status();
  return check_on_device(index, *device, name);
}

Status check_on_context_device(const Context& context,
                               std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors) {
  auto device = context_device(context);
  if (!device) return device.status();
  for (const auto& [tensor, name] : tensors) {
    if (tensor->present()) SMLA_RETURN_IF_ERROR(check_on_device(tensor->device.index, *device, name));
  }
  return Status::Ok();
}

}  // namespace smla::cuda
