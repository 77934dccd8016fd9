// Reading and writing NumPy .npy files (format versions 1.0 and 2.0; 3.0 is
// read too). Only what the replay format needs: little-endian integer and
// float element types, C order, up to 4 dimensions.
//
// The parser is strict and never trusts the file: every problem (bad magic,
// truncated header, header that is not a dict, unsupported dtype, Fortran
// order, shape that disagrees with the data size) is a Status naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::cli {

// The element types an .npy file may hold here. bf16 travels as kU16 (raw bits)
// because NumPy has no bfloat16.
enum class NpyDType : std::uint8_t { kU8, kU16, kI32, kI64, kF32, kF64 };

std::size_t npy_dtype_size(NpyDType dtype);
std::string_view npy_dtype_descr(NpyDType dtype);  // "|u1", "<u2", "<i4", ...

struct NpyArray {
  NpyDType dtype = NpyDType::kU8;
  std::vector<std::int64_t> shape;  // rank 0..kMaxRank
  std::vector<std::byte> data;      // C order, little-endian, numel * itemsize bytes

  std::int64_t numel() const;
  // Contiguous CPU view of the data with the given smla dtype, whose size must
  // equal this array's item size (kBF16 or kU16-sized types over kU16, ...).
  TensorView view(DType as) const;
  // "<f4[2, 3]"
  std::string describe() const;

  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

// The preamble and header of an .npy file: what the data must be.
struct NpyHeader {
  NpyDType dtype = NpyDType::kU8;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the data
  std::uint64_t data_bytes = 0;  // numel * itemsize
};

// Parses the preamble and header from the first bytes of a file (`bytes` may
// hold more, e.g. the whole file). Never reads past `bytes`.
Expected<NpyHeader> parse_npy_header(std::span<const std::byte> bytes, std::string_view name);

// Parses a whole .npy file held in memory. `name` (usually the path) prefixes errors.
Expected<NpyArray> parse_npy(std::span<const std::byte> bytes, std::string_view name);
// Reads a file: its kind is checked first (a directory, FIFO, device or symlink
// loop is named as such), then its header, then its size against the header
// and the data size against host_allocation_limit(); only then is the data read.
Expected<NpyArray> read_npy(const std::filesystem::path& path);

// Serializes as version 1.0 (2.0 only when the header would not fit in 64 KiB).
std::vector<std::byte> serialize_npy(const NpyArray& array);
Status write_npy(const std::filesystem::path& path, const NpyArray& array);

// The .npy element type that stores an smla dtype: bf16 -> kU16 (raw bits),
// e4m3/u8 -> kU8, i32, i64, f32, f64. f16 has none.
Expected<NpyDType> npy_dtype_for(DType dtype, std::string_view name);

// Copies a CPU tensor of any strides into a C-order array of the matching dtype
// (bf16 -> kU16, e4m3/u8 -> kU8, i32, i64, f32, f64). f16 is refused.
Expected<NpyArray> npy_from_tensor(const TensorView& tensor, std::string_view name);

}  // namespace smla::cli
