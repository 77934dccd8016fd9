// Element types and devices a TensorView can describe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace smla {

enum class DType : std::uint8_t { kBF16, kF16, kF32, kF64, kE4M3, kU8, kI32, kI64 };

constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kE4M3: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kE4M3: return "e4m3";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "unknown";
}

enum class DeviceKind : std::uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

constexpr std::string_view device_kind_name(DeviceKind kind) {
  return kind == DeviceKind::kCpu ? "cpu" : "cuda";
}

}  // namespace smla
