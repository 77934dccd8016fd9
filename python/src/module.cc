// smla._C: the Python extension over the C++ entry points (no PyTorch dependency).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/src/bindings.h"
#include "python/src/py_tensor.h"
#include "smla/backend.h"
#include "smla/version.h"

#if defined(SMLA_HAS_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;

namespace {

py::list cuda_devices() {
  py::list devices;
#if defined(SMLA_HAS_CUDA)
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    py::dict d;
    d["index"] = i;
    d["name"] = std::string(prop.name);
    d["compute_capability"] = py::make_tuple(prop.major, prop.minor);
    d["multiprocessors"] = prop.multiProcessorCount;
    d["memory_bytes"] = static_cast<std::size_t>(prop.totalGlobalMem);
    devices.append(d);
  }
#endif
  return devices;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "smla C++ entry points over DLPack (use the smla package, not this module)";
  static py::exception<smla::python::SmlaError> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const smla::python::SmlaError& e) {
      PyErr_SetString(error.ptr(), e.message.c_str());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(error.ptr(), "Internal: out of host memory");
    }
  });

  m.def("version", [] { return std::string(smla::version()); });
  m.def("compiled_backends", [] {
    py::list names;
    for (const char* name : {"reference", "cpu"}) names.append(name);
#if defined(SMLA_HAS_CUDA)
    names.append("cuda");
#endif
    return names;
  });
  m.def("available_backends", [] {
    py::list names;
    for (smla::Backend b : smla::available_backends()) names.append(std::string(smla::backend_name(b)));
    return names;
  });
  m.def("cuda_devices", &cuda_devices);
  m.def("torch_exchange_api", &smla::python::torch_exchange_api_available);
  m.def("backend_code", [](const std::string& name) {
    if (name == "auto") return -1;
    const smla::Expected<smla::Backend> backend = smla::parse_backend(name);
    smla::python::throw_if_error(backend.status());
    return static_cast<int>(*backend);
  });

  m.def("raw_buffer", [](py::handle object, const std::string& name) {
    const smla::python::RawBuffer buffer = smla::python::raw_buffer(object, name);
    return py::make_tuple(buffer.address, buffer.bytes, std::string(smla::device_kind_name(buffer.device.kind)));
  });

  smla::python::bind_attention(m);
  smla::python::bind_formats(m);
  smla::python::bind_metadata(m);
}
