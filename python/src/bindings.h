// One registration function per area of the extension module (module.cc calls them).
#pragma once

#include <pybind11/pybind11.h>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/status.h"

namespace smla::python {

// Makes `device` current and stores the previous one in *previous (when not null); a no-op
// returning Ok where it is already current or in builds without CUDA.
Status switch_device(int device, int* previous);

// The calling thread's context of `backend` on the current device, made on first
// use. Kept per thread so a call sets its stream and workspace on it without
// copying or locking.
Expected<Context*> thread_context(Backend backend);

void bind_attention(pybind11::module_& m);
void bind_formats(pybind11::module_& m);
void bind_metadata(pybind11::module_& m);

}  // namespace smla::python
