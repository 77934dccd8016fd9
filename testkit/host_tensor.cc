#include "testkit/host_tensor.h"

#include <cstring>
#include <new>

namespace smla::testkit {

namespace {

constexpr std::align_val_t kAlignment{64};

TensorView view_of(void* data, DType dtype, const std::vector<std::int64_t>& shape,
                   const std::vector<std::int64_t>& strides) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.rank = static_cast<int>(shape.size());
  std::int64_t running = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    view.shape[i] = shape[i];
    view.stride[i] = strides.empty() ? running : strides[i];
    running *= shape[i];
  }
  return view;
}

}  // namespace

void HostTensor::AlignedDelete::operator()(std::byte* p) const { ::operator delete[](p, kAlignment); }

std::size_t storage_bytes(const TensorView& view) {
  if (!view.present()) return 0;
  std::int64_t last = 0;
  for (int d = 0; d < view.rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (view.shape[i] <= 0) return 0;
    last += (view.shape[i] - 1) * view.stride[i];
  }
  return static_cast<std::size_t>(last + 1) * dtype_size(view.dtype);
}

HostTensor HostTensor::zeros(DType dtype, const std::vector<std::int64_t>& shape,
                             const std::vector<std::int64_t>& strides) {
  HostTensor tensor;
  const TensorView probe = view_of(nullptr, dtype, shape, strides);
  tensor.size_bytes_ = storage_bytes(probe);
  // Never a null pointer, even for an empty tensor, so "present" views stay valid.
  const std::size_t allocation = tensor.size_bytes_ > 0 ? tensor.size_bytes_ : 64;
  tensor.storage_.reset(static_cast<std::byte*>(::operator new[](allocation, kAlignment)));
  std::memset(tensor.storage_.get(), 0, allocation);
  tensor.view_ = view_of(tensor.storage_.get(), dtype, shape, strides);
  return tensor;
}

HostTensor HostTensor::clone() const {
  HostTensor copy;
  if (!present()) return copy;
  const std::size_t allocation = size_bytes_ > 0 ? size_bytes_ : 64;
  copy.storage_.reset(static_cast<std::byte*>(::operator new[](allocation, kAlignment)));
  std::memcpy(copy.storage_.get(), storage_.get(), allocation);
  copy.size_bytes_ = size_bytes_;
  copy.view_ = view_;
  copy.view_.data = copy.storage_.get();
  return copy;
}

}  // namespace smla::testkit
