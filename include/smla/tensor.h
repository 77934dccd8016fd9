// TensorView: a non-owning, framework-free description of a strided tensor.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "smla/dtype.h"
#include "smla/status.h"

namespace smla {

inline constexpr int kMaxRank = 4;

// Pointer, dtype, up to 4-D shape, strides in elements, device. Copying a view
// never copies data. A default-constructed view is "absent" (data == nullptr,
// rank == -1); optional arguments use that state.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kU8;
  int rank = -1;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};  // in elements, not bytes
  Device device{};

  // A view with row-major contiguous strides.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = {});
  // A view with explicit strides (in elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> stride, Device device = {});

  bool present() const { return rank >= 0; }
  std::int64_t size(int dim) const { return shape[static_cast<std::size_t>(dim)]; }
  std::int64_t numel() const;
  bool is_contiguous() const;
  // Byte offset of an element given its indices (one per dimension).
  std::int64_t offset_elements(std::initializer_list<std::int64_t> index) const;

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  template <class T>
  T* ptr_at(std::initializer_list<std::int64_t> index) const {
    return static_cast<T*>(data) + offset_elements(index);
  }

  // "bf16[4, 64, 512] strides [32768, 512, 1] cpu"
  std::string describe() const;
  std::string shape_string() const;  // "[4, 64, 512]"
};

}  // namespace smla
