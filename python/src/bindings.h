// One registration function per area of the extension module (module.cc calls them).
#pragma once

#include <pybind11/pybind11.h>

#include "smla/status.h"

namespace smla::python {

// Makes `device` current and stores the previous one in *previous (when not null); a no-op
// returning Ok where it is already current or in builds without CUDA.
Status switch_device(int device, int* previous);

void bind_attention(pybind11::module_& m);
void bind_formats(pybind11::module_& m);
void bind_metadata(pybind11::module_& m);

}  // namespace smla::python
