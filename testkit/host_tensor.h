// HostTensor: an owning, 64-byte aligned CPU buffer with a TensorView over it.
// Test cases, the CLI and the benchmarks allocate every tensor through it so a
// case can hand out views whose strides may be padded on purpose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "smla/tensor.h"

namespace smla::testkit {

class HostTensor {
 public:
  HostTensor() = default;  // absent: view().present() is false

  // Zero-filled storage for `shape` with element `strides` (row-major
  // contiguous when `strides` is empty). Strides must be >= 0.
  static HostTensor zeros(DType dtype, const std::vector<std::int64_t>& shape,
                          const std::vector<std::int64_t>& strides = {});

  HostTensor(HostTensor&&) noexcept = default;
  HostTensor& operator=(HostTensor&&) noexcept = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor clone() const;  // same shape, strides and bytes (padding included)

  const TensorView& view() const { return view_; }
  bool present() const { return view_.present(); }
  std::byte* bytes() const { return storage_.get(); }
  std::size_t size_bytes() const { return size_bytes_; }

 private:
  struct AlignedDelete {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], AlignedDelete> storage_;
  std::size_t size_bytes_ = 0;
  TensorView view_{};
};

// Bytes from the first element to one past the last one that `view` can
// address (0 for an absent or empty view). Useful to copy a view to a device.
std::size_t storage_bytes(const TensorView& view);

}  // namespace smla::testkit
