#include "python/src/py_tensor.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

namespace smla::python {
namespace {

// DLPack 0.6 (Debian's header) predates the float8 codes; 1.1 numbers them.
constexpr std::uint8_t kDLFloat8E4m3fn = 10;

// DLPack 1.3's C exchange API (absent from Debian's 0.6 header, so declared here from the
// spec): a producer type publishes `__dlpack_c_exchange_api__`, a "dlpack_exchange_api"
// capsule of this table, whose dltensor_from_py_object_no_sync fills a borrowed DLTensor in
// tens of nanoseconds -- a tenth of reading a torch.Tensor's attributes. DLTensor itself is
// unchanged since 0.6.
struct ExchangeApiHeader {
  std::uint32_t major;
  std::uint32_t minor;
  ExchangeApiHeader* prev_api;
};
struct ExchangeApi {
  ExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  int (*current_work_stream)(int device_type, std::int32_t device_id, void** out_stream);
};

using DlTensorFromObject = int (*)(void*, DLTensor*);

// The table's tensor view function, or nullptr when `type` publishes no usable table.
DlTensorFromObject exchange_view_function(const py::handle& type) {
  PyObject* capsule = PyObject_GetAttrString(type.ptr(), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const auto* api = static_cast<const ExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
  Py_DECREF(capsule);  // the table lives as long as the process (the spec's rule)
  if (api == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  return api->header.major == 1 ? api->dltensor_from_py_object_no_sync : nullptr;
}

// An element type as a foreign library names it. int8 has no smla dtype; caches
// accept it as raw bytes (FlashMLA passes int8 / uint8 / float8 caches alike).
struct ForeignType {
  std::optional<DType> dtype;
  bool is_int8 = false;
  std::string name;
};

std::string type_name(const py::handle& object) { return py::str(py::type::handle_of(object).attr("__name__")); }

[[noreturn]] void fail(std::string message) { throw SmlaError{std::move(message)}; }

// torch is never imported here: its types are looked up once the caller has imported it.
struct TorchTypes {
  PyObject* tensor_type = nullptr;
  DlTensorFromObject view_function = nullptr;  // torch >= 2.10: DLPack's C exchange API
  std::vector<std::pair<PyObject*, ForeignType>> dtypes;
};

const TorchTypes* torch_types() {
  static TorchTypes* cached = nullptr;
  if (cached != nullptr) return cached;
  PyObject* modules = PySys_GetObject("modules");  // borrowed
  PyObject* torch = modules != nullptr ? PyDict_GetItemString(modules, "torch") : nullptr;
  if (torch == nullptr) return nullptr;
  auto* types = new TorchTypes();  // lives as long as the interpreter (never freed on purpose)
  py::handle module(torch);
  types->tensor_type = py::object(module.attr("Tensor")).release().ptr();
  types->view_function = exchange_view_function(types->tensor_type);
  const std::pair<const char*, ForeignType> table[] = {
      {"bfloat16", {DType::kBF16, false, "bfloat16"}}, {"float16", {DType::kF16, false, "float16"}},
      {"float32", {DType::kF32, false, "float32"}},    {"float64", {DType::kF64, false, "float64"}},
      {"uint8", {DType::kU8, false, "uint8"}},         {"int32", {DType::kI32, false, "int32"}},
      {"int64", {DType::kI64, false, "int64"}},        {"int8", {std::nullopt, true, "int8"}},
      {"float8_e4m3fn", {DType::kE4M3, false, "float8_e4m3fn"}},
  };
  for (const auto& [attr, type] : table) {
    if (py::hasattr(module, attr)) types->dtypes.emplace_back(py::object(module.attr(attr)).release().ptr(), type);
  }
  cached = types;
  return cached;
}

Device device_of(int kind_is_cuda, std::int64_t index) {
  return Device{kind_is_cuda ? DeviceKind::kCuda : DeviceKind::kCpu, static_cast<int>(index)};
}

struct Described {
  void* data = nullptr;
  ForeignType type;
  std::vector<std::int64_t> shape, stride;  // stride in elements
  Device device{};
  bool writable = true;
};

// Raw CPython calls with interned names: this runs for every tensor of every call, and
// pybind11's attr("...") builds a new string each time (the host-overhead budget is ~1 us a tensor).
struct TorchNames {
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
  PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* get_device = PyUnicode_InternFromString("get_device");
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* stride = PyUnicode_InternFromString("stride");
};

py::object attr(const py::handle& object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object.ptr(), name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

py::object call_method(const py::handle& object, PyObject* name) {
  PyObject* value = PyObject_CallMethodNoArgs(object.ptr(), name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

std::vector<std::int64_t> int_tuple(const py::object& tuple) {
  if (!PyTuple_Check(tuple.ptr())) return tuple.cast<std::vector<std::int64_t>>();
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple.ptr());
  std::vector<std::int64_t> values(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple.ptr(), i));
  return values;
}

Described describe_torch(const py::handle& object, const TorchTypes& torch, std::string_view name) {
  static const TorchNames* names = new TorchNames();  // lives as long as the interpreter
  Described d;
  const py::object dtype = attr(object, names->dtype);
  for (const auto& [key, type] : torch.dtypes) {
    if (key == dtype.ptr()) d.type = type;
  }
  if (!d.type.dtype && !d.type.is_int8) d.type.name = py::str(dtype);
  if (attr(object, names->is_cuda).ptr() == Py_True) {
    d.device = device_of(1, PyLong_AsLongLong(call_method(object, names->get_device).ptr()));
  } else if (attr(object, names->is_cpu).ptr() != Py_True) {
    fail(fmt::format("{}: expected a CPU or CUDA tensor, got a tensor on {}", name,
                     std::string(py::str(object.attr("device")))));
  }
  d.data = PyLong_AsVoidPtr(call_method(object, names->data_ptr).ptr());
  d.shape = int_tuple(attr(object, names->shape));
  d.stride = int_tuple(call_method(object, names->stride));
  return d;
}

Described describe_numpy(const py::array& array, std::string_view name) {
  Described d;
  const py::dtype dtype = array.dtype();
  const char kind = dtype.kind();
  const auto itemsize = static_cast<std::int64_t>(dtype.itemsize());
  const std::string dtype_name = py::str(dtype.attr("name"));
  d.type.name = dtype_name;
  if (dtype.attr("byteorder").cast<std::string>() == ">") {
    fail(fmt::format("{}: expected a native byte order array, got dtype {}", name, std::string(py::str(static_cast<const py::handle&>(dtype)))));
  }
  if (dtype_name == "bfloat16") d.type.dtype = DType::kBF16;  // ml_dtypes
  else if (dtype_name == "float8_e4m3fn") d.type.dtype = DType::kE4M3;
  else if (kind == 'f' && itemsize == 2) d.type.dtype = DType::kF16;
  else if (kind == 'f' && itemsize == 4) d.type.dtype = DType::kF32;
  else if (kind == 'f' && itemsize == 8) d.type.dtype = DType::kF64;
  else if (kind == 'u' && itemsize == 1) d.type.dtype = DType::kU8;
  else if (kind == 'u' && itemsize == 2) d.type.dtype = DType::kBF16;  // bf16 bit patterns: NumPy has no bf16
  else if (kind == 'i' && itemsize == 4) d.type.dtype = DType::kI32;
  else if (kind == 'i' && itemsize == 8) d.type.dtype = DType::kI64;
  else if (kind == 'i' && itemsize == 1) d.type.is_int8 = true;
  d.data = const_cast<void*>(array.data());
  d.writable = array.writeable();
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    const auto bytes = static_cast<std::int64_t>(array.strides(i));
    if (bytes % itemsize != 0) {
      fail(fmt::format("{}: expected strides that are a multiple of the element size {}, got {} bytes in dimension {}",
                       name, itemsize, bytes, i));
    }
    d.shape.push_back(static_cast<std::int64_t>(array.shape(i)));
    d.stride.push_back(bytes / itemsize);
  }
  return d;
}

ForeignType dlpack_type(const DLDataType& t) {
  ForeignType type;
  type.name = fmt::format("DLPack code {} bits {} lanes {}", t.code, t.bits, t.lanes);
  if (t.lanes != 1) return type;
  if (t.code == kDLBfloat && t.bits == 16) type.dtype = DType::kBF16;
  else if (t.code == kDLFloat && t.bits == 16) type.dtype = DType::kF16;
  else if (t.code == kDLFloat && t.bits == 32) type.dtype = DType::kF32;
  else if (t.code == kDLFloat && t.bits == 64) type.dtype = DType::kF64;
  else if (t.code == kDLFloat8E4m3fn && t.bits == 8) type.dtype = DType::kE4M3;
  else if (t.code == kDLUInt && t.bits == 8) type.dtype = DType::kU8;
  else if (t.code == kDLUInt && t.bits == 16) type.dtype = DType::kBF16;  // bf16 bit patterns
  else if (t.code == kDLInt && t.bits == 32) type.dtype = DType::kI32;
  else if (t.code == kDLInt && t.bits == 64) type.dtype = DType::kI64;
  else if (t.code == kDLInt && t.bits == 8) type.is_int8 = true;
  if (type.dtype) type.name = std::string(dtype_name(*type.dtype));
  if (type.is_int8) type.name = "int8";
  return type;
}

void check_dlpack_device(int device_type, std::string_view name) {
  if (device_type != kDLCPU && device_type != kDLCUDA && device_type != kDLCUDAHost && device_type != kDLCUDAManaged) {
    fail(fmt::format("{}: expected a CPU or CUDA tensor, got DLPack device type {}", name, device_type));
  }
}

// A DLTensor the caller borrows from a live object: everything is copied out.
Described describe_dltensor(const DLTensor& t, std::string_view name) {
  check_dlpack_device(t.device.device_type, name);
  Described d;
  d.type = dlpack_type(t.dtype);
  const bool cuda = t.device.device_type == kDLCUDA || t.device.device_type == kDLCUDAManaged;
  d.device = device_of(cuda, t.device.device_id);
  d.data = static_cast<char*>(t.data) + t.byte_offset;
  d.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides == nullptr) {  // row-major
    d.stride.assign(d.shape.size(), 1);
    for (int i = t.ndim - 2; i >= 0; --i) d.stride[i] = d.stride[i + 1] * d.shape[i + 1];
  } else {
    d.stride.assign(t.strides, t.strides + t.ndim);
  }
  return d;
}

Described describe_dlpack(const py::handle& object, std::string_view name, std::vector<py::object>& keep_alive) {
  const auto device = object.attr("__dlpack_device__")().cast<std::pair<int, std::int64_t>>();
  const int device_type = device.first;
  check_dlpack_device(device_type, name);
  const bool cuda = device_type == kDLCUDA || device_type == kDLCUDAManaged;
  // stream=-1: the caller orders its own streams; the producer must not synchronize.
  py::object capsule = cuda ? object.attr("__dlpack__")(py::arg("stream") = -1) : object.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    fail(fmt::format("{}: __dlpack__ did not return an unused 'dltensor' capsule", name));
  }
  keep_alive.push_back(capsule);  // the producer frees it when the capsule dies unconsumed
  return describe_dltensor(managed->dl_tensor, name);
}

Described describe(const py::handle& object, std::string_view name, std::vector<py::object>& keep_alive) {
  if (const TorchTypes* torch = torch_types(); torch != nullptr &&
      PyObject_IsInstance(object.ptr(), torch->tensor_type) == 1) {
    if (torch->view_function != nullptr) {
      DLTensor view{};
      if (torch->view_function(object.ptr(), &view) == 0) return describe_dltensor(view, name);
      PyErr_Clear();  // e.g. a device DLPack cannot name: the attribute path says which
    }
    return describe_torch(object, *torch, name);
  }
  if (py::isinstance<py::array>(object)) return describe_numpy(py::reinterpret_borrow<py::array>(object), name);
  if (py::hasattr(object, "__dlpack__") && py::hasattr(object, "__dlpack_device__")) {
    return describe_dlpack(object, name, keep_alive);
  }
  fail(fmt::format("{}: expected a tensor (torch.Tensor, a NumPy array or an object with __dlpack__), got {}", name,
                   type_name(object)));
}

TensorView to_view(const Described& d, DType dtype, std::string_view name) {
  if (d.shape.size() > static_cast<std::size_t>(kMaxRank)) {
    fail(fmt::format("{}: expected at most {} dimensions, got {}", name, kMaxRank, d.shape.size()));
  }
  TensorView view;
  view.data = d.data;
  view.dtype = dtype;
  view.rank = static_cast<int>(d.shape.size());
  for (std::size_t i = 0; i < d.shape.size(); ++i) {
    view.shape[i] = d.shape[i];
    view.stride[i] = d.stride[i];
  }
  view.device = d.device;
  return view;
}

void check_writable(const Described& d, std::string_view name, Access access) {
  if (access == Access::kWrite && !d.writable) fail(fmt::format("{}: expected a writable array, got a read-only one", name));
}

}  // namespace

TensorView PyTensorArgs::view(const py::handle& object, std::string_view name, Access access) {
  if (object.is_none()) return TensorView{};
  const Described d = describe(object, name, keep_alive_);
  check_writable(d, name, access);
  if (!d.type.dtype) {
    fail(fmt::format("{}: expected one of bf16, f16, f32, f64, e4m3, u8, i32, i64, got {}", name, d.type.name));
  }
  return to_view(d, *d.type.dtype, name);
}

KvCacheView PyTensorArgs::cache(const py::handle& object, std::string_view name, int format, float fp8_scale,
                                Access access) {
  Described d = describe(object, name, keep_alive_);
  check_writable(d, name, access);
  if (d.shape.size() == 4) {
    if (d.shape[2] != 1) {
      fail(fmt::format("{}: expected [num_blocks, block_size, 1, row] (one KV head), got {} blocks x {} x {} heads",
                       name, d.shape[0], d.shape[1], d.shape[2]));
    }
    d.shape.erase(d.shape.begin() + 2);
    d.stride.erase(d.stride.begin() + 2);
  }
  const bool one_byte = d.type.is_int8 || d.type.dtype == DType::kU8 || d.type.dtype == DType::kE4M3;
  if (!one_byte && d.type.dtype != DType::kBF16) {
    fail(fmt::format("{}: expected a cache of uint8, int8, float8_e4m3fn or bfloat16, got {}", name, d.type.name));
  }
  const std::int64_t row = d.shape.empty() ? -1 : d.shape.back();
  KvCacheView cache;
  cache.fp8_scale = fp8_scale;
  if (format < 0) {
    if (one_byte && row == V4Fp8Format::kBytesPerToken) cache.format = KvFormat::kV4Fp8;
    else if (one_byte && row == V32Fp8Format::kBytesPerToken) cache.format = KvFormat::kV32Fp8;
    else if (one_byte && row == Fp8RowsFormat::kHeadDim) cache.format = KvFormat::kFp8Rows;
    else if (!one_byte && row == Bf16RowsFormat::kHeadDim) cache.format = KvFormat::kBf16Rows;
    else {
      fail(fmt::format("{}: cannot infer the KV format from a {} cache with rows of {} (584 bytes: v4-fp8, 656: "
                       "v32-fp8, 512 bytes: fp8-rows, 512 bf16: bf16-rows); pass smla.KvCache(pages, format=...)",
                       name, d.type.name, row));
    }
  } else {
    cache.format = static_cast<KvFormat>(format);
  }
  const KvFormatInfo info = kv_format_info(cache.format);
  // Byte-typed caches are reinterpreted as the format's storage type (same size).
  const DType storage = one_byte && dtype_size(info.storage_dtype) == 1 ? info.storage_dtype
                                                                        : d.type.dtype.value_or(DType::kU8);
  cache.pages = to_view(d, storage, name);
  return cache;
}

void merge_leading_dims(TensorView& view, std::string_view name, int rank) {
  if (view.rank != rank + 1) return;
  // [b, s_q, ...] -> [b * s_q, ...] when the two strides allow it without a copy.
  const bool mergeable = view.shape[0] <= 1 || view.shape[1] <= 1 || view.stride[0] == view.stride[1] * view.shape[1];
  if (!mergeable) {
    fail(fmt::format("{}: expected [b, s_q, ...] whose first two dimensions merge without a copy, got {}", name,
                     view.describe()));
  }
  const std::int64_t inner_stride = view.shape[1] <= 1 ? view.stride[0] : view.stride[1];
  view.shape[0] *= view.shape[1];
  view.stride[0] = inner_stride;
  for (int i = 1; i < rank; ++i) {
    view.shape[static_cast<std::size_t>(i)] = view.shape[static_cast<std::size_t>(i) + 1];
    view.stride[static_cast<std::size_t>(i)] = view.stride[static_cast<std::size_t>(i) + 1];
  }
  view.shape[static_cast<std::size_t>(rank)] = 0;
  view.stride[static_cast<std::size_t>(rank)] = 0;
  view.rank = rank;
}

RawBuffer raw_buffer(const py::handle& object, std::string_view name) {
  std::vector<py::object> keep_alive;
  const Described d = describe(object, name, keep_alive);
  if (!d.type.dtype && !d.type.is_int8) fail(fmt::format("{}: expected a byte buffer, got {}", name, d.type.name));
  const std::size_t element = d.type.dtype ? dtype_size(*d.type.dtype) : 1;
  std::int64_t count = 1, expected_stride = 1;
  for (std::size_t i = d.shape.size(); i-- > 0;) {
    if (d.shape[i] != 1 && d.stride[i] != expected_stride) fail(fmt::format("{}: expected a contiguous buffer", name));
    expected_stride *= d.shape[i];
    count *= d.shape[i];
  }
  return RawBuffer{reinterpret_cast<std::uintptr_t>(d.data), static_cast<std::size_t>(count) * element, d.device};
}

bool torch_exchange_api_available() {
  const TorchTypes* torch = torch_types();
  return torch != nullptr && torch->view_function != nullptr;
}

void throw_if_error(const Status& status) {
  if (!status.ok()) throw SmlaError{status.to_string()};
}

}  // namespace smla::python
