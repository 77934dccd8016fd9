// Internal: where a CUDA entry's tensors must live. Every device entry runs on
// the calling thread's current device, and each of its tensors must be there.
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::cuda {

// The calling thread's current device, or the CUDA error as a Status.
Expected<int> current_device();

// The device index `index` of the argument `name` is `current` (the current device, already read).
Status check_on_device(int index, int current, std::string_view name);

// The device index `index` of the argument `name` is the current device.
Status check_on_current_device(int index, std::string_view name);

// Every present tensor of the list is on the current device; the error names
// the first that is not.
Status check_on_current_device(std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors);

}  // namespace smla::cuda
