// KV formats (read from the traits in smla/kv_format.h) and the host codecs.
#include <pybind11/pybind11.h>

#include <string>

#include "python/src/bindings.h"
#include "python/src/py_tensor.h"
#include "smla/codec.h"
#include "smla/kv_format.h"

namespace smla::python {

void bind_formats(py::module_& m) {
  m.def("kv_formats", [] {  // names in KvFormat order: the one list in smla/kv_format.h
    py::list names;
    for (KvFormat format : kAllKvFormats) names.append(py::str(std::string(kv_format_name(format))));
    return names;
  });
  m.def("kv_format_info", [](const std::string& name) {
    const Expected<KvFormat> format = parse_kv_format(name);
    throw_if_error(format.status());
    const KvFormatInfo info = kv_format_info(*format);
    py::dict d;
    d["name"] = std::string(info.name);
    d["code"] = static_cast<int>(info.format);
    d["head_dim"] = info.head_dim;
    d["value_dim"] = info.value_dim;
    d["bytes_per_token"] = info.bytes_per_token;
    d["storage_dtype"] = std::string(dtype_name(info.storage_dtype));
    d["row_elements"] = info.row_elements;
    return d;
  });
  m.def("page_bytes", [](const std::string& name, std::int64_t page_size) {
    const Expected<KvFormat> format = parse_kv_format(name);
    throw_if_error(format.status());
    if (page_size <= 0) throw SmlaError{"page_size: expected a value > 0, got " + std::to_string(page_size)};
    return visit_kv_format(*format, [&](auto traits) { return decltype(traits)::page_bytes(page_size); });
  });
  m.def("quantize_into_cache", [](py::handle pages, int format, float fp8_scale, py::handle rows, py::handle slots) {
    PyTensorArgs t;
    const KvCacheView cache = t.cache(pages, "cache", format, fp8_scale, Access::kWrite);
    const TensorView row_view = t.view(rows, "rows");
    const TensorView slot_view = t.view(slots, "slots");
    Status status;
    {
      py::gil_scoped_release release;
      status = quantize_into_cache(cache, row_view, slot_view);
    }
    throw_if_error(status);
  });
  m.def("gather_from_cache", [](py::handle pages, int format, float fp8_scale, py::handle slots, py::handle out) {
    PyTensorArgs t;
    const KvCacheView cache = t.cache(pages, "cache", format, fp8_scale);
    const TensorView slot_view = t.view(slots, "slots");
    const TensorView out_view = t.view(out, "out", Access::kWrite);
    Status status;
    {
      py::gil_scoped_release release;
      status = gather_from_cache(cache, slot_view, out_view);
    }
    throw_if_error(status);
  });
}

}  // namespace smla::python
