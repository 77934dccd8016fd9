#include "smla/tensor.h"

#include <fmt/format.h>

#include <cstddef>

namespace smla {

namespace {

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.rank = static_cast<int>(shape.size() > kMaxRank ? kMaxRank : shape.size());
  std::size_t i = 0;
  for (std::int64_t extent : shape) {
    if (i == kMaxRank) break;
    view.shape[i++] = extent;
  }
  view.device = device;
  return view;
}

}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                                  Device device) {
  TensorView view = make_view(data, dtype, shape, device);
  std::int64_t running = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.stride[static_cast<std::size_t>(d)] = running;
    running *= view.shape[static_cast<std::size_t>(d)];
  }
  return view;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> stride, Device device) {
  TensorView view = make_view(data, dtype, shape, device);
  std::size_t i = 0;
  for (std::int64_t s : stride) {
    if (i == kMaxRank) break;
    view.stride[i++] = s;
  }
  return view;
}

std::int64_t TensorView::numel() const {
  if (rank < 0) return 0;
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[static_cast<std::size_t>(d)];
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t running = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    if (shape[i] != 1 && stride[i] != running) return false;
    running *= shape[i];
  }
  return true;
}

std::int64_t TensorView::offset_elements(std::initializer_list<std::int64_t> index) const {
  std::int64_t offset = 0;
  std::size_t d = 0;
  for (std::int64_t i : index) {
    if (d == kMaxRank) break;
    offset += i * stride[d++];
  }
  return offset;
}

std::string TensorView::shape_string() const {
  if (rank < 0) return "<absent>";
  std::string s = "[";
  for (int d = 0; d < rank; ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[static_cast<std::size_t>(d)]);
  }
  return s + "]";
}

std::string TensorView::describe() const {
  if (rank < 0) return "<absent>";
  std::string strides = "[";
  for (int d = 0; d < rank; ++d) {
    if (d) strides += ", ";
    strides += std::to_string(stride[static_cast<std::size_t>(d)]);
  }
  strides += "]";
  return fmt::format("{}{} strides {} {}", dtype_name(dtype), shape_string(), strides, device_kind_name(device.kind));
}

}  // namespace smla
