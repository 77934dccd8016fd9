// Internal: where a CUDA entry's tensors must live. Every device entry runs on
// its context's device, which is the calling thread's current one, and each of
// its tensors must be there. A validating context (Context::create_validating)
// has a nominal device that CUDA is never asked about.
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

#include "smla/context.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::cuda {

// The calling thread's current device, or the CUDA error as a Status.
Expected<int> current_device();

// The device index `index` of the argument `name` is `current` (the current device, already read).
Status check_on_device(int index, int current, std::string_view name);

// The context's device ordinal: its nominal one when it only validates, else the
// calling thread's current device, which must be the context's.
Expected<int> context_device(const Context& context);

// The device index `index` of the argument `name` is the context's device.
Status check_on_context_device(const Context& context, int index, std::string_view name);

// Every present tensor of the list is on the context's device; the error names
// the first that is not.
Status check_on_context_device(const Context& context,
                               std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors);

}  // namespace smla::cuda
