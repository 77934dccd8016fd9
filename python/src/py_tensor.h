// Python objects -> smla::TensorView: the one place the package reads foreign
// tensors. Accepted: torch.Tensor (read through its attributes, the fast path),
// NumPy arrays (buffer metadata, read-only inputs allowed), and any object with
// __dlpack__ / __dlpack_device__ (CuPy, JAX, ...). The views borrow the memory:
// a PyTensorArgs keeps every DLPack capsule alive until the call returns.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "smla/kv_format.h"
#include "smla/tensor.h"

namespace smla::python {

namespace py = pybind11;

// How a view will be used: outputs must be writable.
enum class Access { kRead, kWrite };

// Raised as smla.Error by the module (registered in module.cc).
struct SmlaError {
  std::string message;
};

// Holds what the views of one call borrow.
class PyTensorArgs {
 public:
  // `name` names the argument in errors ("q", "main_indices", ...). None -> an absent view.
  TensorView view(const py::handle& object, std::string_view name, Access access = Access::kRead);
  // A KV cache: pages of rank 3, or rank 4 with a third dimension of 1 (FlashMLA's
  // [num_blocks, block_size, 1, bytes]); 1-byte caches (u8, i8, e4m3) are read as bytes.
  // format < 0 infers the format from the row size and dtype.
  KvCacheView cache(const py::handle& object, std::string_view name, int format, float fp8_scale,
                    Access access = Access::kRead);

 private:
  std::vector<py::object> keep_alive_;
};

// FlashMLA's layouts: a view of rank `rank` + 1 whose first two dimensions are [b, s_q]
// becomes rank `rank` with b * s_q rows, when its strides allow that without a copy (else
// SmlaError naming it). Views of any other rank are left as they are.
void merge_leading_dims(TensorView& view, std::string_view name, int rank);

// Raw address and byte size of a contiguous buffer (a workspace).
struct RawBuffer {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  Device device{};
};
RawBuffer raw_buffer(const py::handle& object, std::string_view name);

// Whether torch tensors are read through DLPack's C exchange API (torch >= 2.10) rather than
// their Python attributes; false until torch is imported.
bool torch_exchange_api_available();

// Throws SmlaError with the status message when it failed.
void throw_if_error(const Status& status);

}  // namespace smla::python
