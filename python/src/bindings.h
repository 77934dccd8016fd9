// One registration function per area of the extension module (module.cc calls them).
#pragma once

#include <pybind11/pybind11.h>

namespace smla::python {

void bind_attention(pybind11::module_& m);
void bind_formats(pybind11::module_& m);
void bind_metadata(pybind11::module_& m);

}  // namespace smla::python
