#include "tools/smla/npy.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>

#include "tools/smla/input_files.h"
#include "tools/smla/tensor_walk.h"

namespace smla::cli {

namespace {

constexpr std::array<unsigned char, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kPreambleBytes = kMagic.size() + 2;  // magic, major, minor
constexpr std::size_t kHeaderAlign = 64;
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 48;
// NumPy writes headers of a few hundred bytes; a longer one is refused before it is read.
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;

constexpr std::array<NpyDType, 6> kAllDTypes = {NpyDType::kU8,  NpyDType::kU16, NpyDType::kI32,
                                                NpyDType::kI64, NpyDType::kF32, NpyDType::kF64};

Status npy_error(std::string_view name, std::string_view problem) {
  return Status(StatusCode::kInvalidArgument, fmt::format("{}: {}", name, problem));
}

Expected<NpyDType> parse_descr(std::string_view descr, std::string_view name) {
  for (NpyDType dtype : kAllDTypes) {
    if (descr == npy_dtype_descr(dtype)) return dtype;
  }
  if (descr == "<u1") return NpyDType::kU8;  // NumPy writes '|u1', but '<u1' is the same thing
  if (descr == "<f2" || descr == "|f2") {
    return npy_error(name, "dtype '<f2' (float16) is not supported: store bf16 as '<u2' raw bits or as '<f4'");
  }
  if (!descr.empty() && descr.front() == '>') {
    return npy_error(name, fmt::format("big-endian dtype '{}' is not supported: save little-endian arrays",
                                       printable(descr)));
  }
  return npy_error(name, fmt::format("unsupported dtype '{}' (supported: |u1 <u2 <i4 <i8 <f4 <f8)", printable(descr)));
}

// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : text_(text), name_(name) {}

  Status parse() {
    skip_space();
    if (!consume('{')) return fail("header is not a Python dict (expected '{')");
    for (;;) {
      skip_space();
      if (consume('}')) break;
      auto key = parse_string();
      if (!key) return key.status();
      skip_space();
      if (!consume(':')) return fail(fmt::format("expected ':' after key '{}'", printable(*key)));
      skip_space();
      SMLA_RETURN_IF_ERROR(parse_value(*key));
      skip_space();
      if (consume('}')) break;
      if (!consume(',')) return fail("expected ',' or '}' between dict entries");
    }
    skip_space();
    if (pos_ != text_.size()) return fail("unexpected text after the header dict");
    if (!descr_) return fail("header has no 'descr' key");
    if (!fortran_order_) return fail("header has no 'fortran_order' key");
    if (!shape_) return fail("header has no 'shape' key");
    if (*fortran_order_) return fail("fortran_order True is not supported: save C-order arrays (np.ascontiguousarray)");
    return Status::Ok();
  }

  NpyDType dtype() const { return *dtype_; }
  const std::vector<std::int64_t>& shape() const { return *shape_; }

 private:
  Status fail(std::string_view problem) const {
    return npy_error(name_, fmt::format("bad .npy header at offset {}: {}", pos_, problem));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }
  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool consume_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Expected<std::string> parse_string() {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return fail("expected a quoted string");
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return fail("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    if (value.find('\\') != std::string::npos) return fail("escape sequences are not supported in header strings");
    pos_ = end + 1;
    return value;
  }

  Status parse_value(const std::string& key) {
    if (key == "descr") {
      if (descr_) return fail("duplicate key 'descr'");
      auto descr = parse_string();
      if (!descr) return fail("'descr' must be a string such as '<f4' (structured dtypes are not supported)");
      auto dtype = parse_descr(*descr, name_);
      if (!dtype) return dtype.status();
      descr_ = *descr;
      dtype_ = *dtype;
      return Status::Ok();
    }
    if (key == "fortran_order") {
      if (fortran_order_) return fail("duplicate key 'fortran_order'");
      if (consume_word("True")) {
        fortran_order_ = true;
      } else if (consume_word("False")) {
        fortran_order_ = false;
      } else {
        return fail("'fortran_order' must be True or False");
      }
      return Status::Ok();
    }
    if (key == "shape") {
      if (shape_) return fail("duplicate key 'shape'");
      return parse_shape();
    }
    return fail(fmt::format("unknown header key '{}'", printable(key)));
  }

  Status parse_shape() {
    if (!consume('(')) return fail("'shape' must be a tuple such as (2, 3)");
    std::vector<std::int64_t> shape;
    for (;;) {
      skip_space();
      if (consume(')')) break;
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
        return fail("shape entries must be non-negative integers");
      }
      std::int64_t extent = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        extent = extent * 10 + (text_[pos_++] - '0');
        if (extent > kMaxExtent) return fail("shape entry too large");
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
      shape.push_back(extent);
      if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
        return fail(fmt::format("rank above {} is not supported", kMaxRank));
      }
      skip_space();
      if (consume(')')) break;
      if (!consume(',')) return fail("expected ',' or ')' in shape");
    }
    shape_ = std::move(shape);
    return Status::Ok();
  }

  std::string_view text_;
  std::string_view name_;
  std::size_t pos_ = 0;
  std::optional<std::string> descr_;
  std::optional<NpyDType> dtype_;
  std::optional<bool> fortran_order_;
  std::optional<std::vector<std::int64_t>> shape_;
};

std::uint32_t read_le(std::span<const std::byte> bytes, std::size_t offset, std::size_t width) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < width; ++i) {
    value |= static_cast<std::uint32_t>(bytes[offset + i]) << (8 * i);
  }
  return value;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

}  // namespace

std::size_t npy_dtype_size(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kU8: return 1;
    case NpyDType::kU16: return 2;
    case NpyDType::kI32: return 4;
    case NpyDType::kI64: return 8;
    case NpyDType::kF32: return 4;
    case NpyDType::kF64: return 8;
  }
  return 0;
}

std::string_view npy_dtype_descr(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kU8: return "|u1";
    case NpyDType::kU16: return "<u2";
    case NpyDType::kI32: return "<i4";
    case NpyDType::kI64: return "<i8";
    case NpyDType::kF32: return "<f4";
    case NpyDType::kF64: return "<f8";
  }
  return "?";
}

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (std::int64_t extent : shape) n *= extent;
  return n;
}

TensorView NpyArray::view(DType as) const {
  TensorView view;
  view.data = const_cast<std::byte*>(data.data());
  view.dtype = as;
  view.rank = static_cast<int>(shape.size());
  std::int64_t running = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.shape[static_cast<std::size_t>(d)] = shape[static_cast<std::size_t>(d)];
    view.stride[static_cast<std::size_t>(d)] = running;
    running *= shape[static_cast<std::size_t>(d)];
  }
  return view;
}

std::string NpyArray::describe() const {
  return fmt::format("{}[{}]", npy_dtype_descr(dtype), fmt::join(shape, ", "));
}

Expected<NpyHeader> parse_npy_header(std::span<const std::byte> bytes, std::string_view name) {
  if (bytes.size() < kPreambleBytes) {
    return npy_error(name, fmt::format("truncated .npy file ({} bytes, the preamble alone needs {})", bytes.size(),
                                       kPreambleBytes));
  }
  if (std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    return npy_error(name, "not an .npy file (bad magic, expected \\x93NUMPY)");
  }
  const auto major = static_cast<unsigned>(bytes[6]);
  const auto minor = static_cast<unsigned>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return npy_error(name, fmt::format("unsupported .npy format version {}.{} (supported: 1.0, 2.0, 3.0)", major, minor));
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < kPreambleBytes + length_bytes) {
    return npy_error(name, "truncated .npy file (header length missing)");
  }
  const std::size_t header_len = read_le(bytes, kPreambleBytes, length_bytes);
  const std::size_t header_start = kPreambleBytes + length_bytes;
  if (header_len > kMaxHeaderBytes) {
    return npy_error(name, fmt::format("header of {} bytes (at most {} are read)", header_len, kMaxHeaderBytes));
  }
  if (header_len > bytes.size() - header_start) {
    return npy_error(name, fmt::format("truncated .npy file (header of {} bytes, only {} present)", header_len,
                                       bytes.size() - header_start));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + header_start), header_len);
  HeaderParser parser(header, name);
  SMLA_RETURN_IF_ERROR(parser.parse());

  NpyHeader result;
  result.dtype = parser.dtype();
  result.shape = parser.shape();
  result.data_offset = header_start + header_len;
  std::int64_t data_bytes = static_cast<std::int64_t>(npy_dtype_size(result.dtype));
  for (std::int64_t extent : result.shape) {
    if (extent != 0 && data_bytes > std::numeric_limits<std::int64_t>::max() / extent) {
      return npy_error(name, fmt::format("shape {} is too large", shape_text(result.shape)));
    }
    data_bytes *= extent;
  }
  result.data_bytes = static_cast<std::uint64_t>(data_bytes);
  return result;
}

namespace {

Status check_data_size(const NpyHeader& header, std::uint64_t available, std::string_view name) {
  if (header.data_bytes == available) return Status::Ok();
  return npy_error(name, fmt::format("shape {} of {} needs {} data bytes, the file holds {}", shape_text(header.shape),
                                     npy_dtype_descr(header.dtype), header.data_bytes, available));
}

}  // namespace

Expected<NpyArray> parse_npy(std::span<const std::byte> bytes, std::string_view name) {
  auto header = parse_npy_header(bytes, name);
  if (!header) return header.status();
  SMLA_RETURN_IF_ERROR(check_data_size(*header, bytes.size() - header->data_offset, name));
  NpyArray array;
  array.dtype = header->dtype;
  array.shape = header->shape;
  const auto* first = bytes.data() + header->data_offset;
  array.data.assign(first, first + header->data_bytes);
  return array;
}

Expected<NpyArray> read_npy(const std::filesystem::path& path) {
  const std::string name = printable(path.string());
  // Any size may be opened: the header is read first and says how much data to expect.
  auto file = InputFile::open(path, "an .npy file", std::numeric_limits<std::uint64_t>::max());
  if (!file) return file.status();
  // The preamble and the header length, then the header itself, then (once the
  // file's size agrees with the header and the allocation fits) the data.
  std::vector<std::byte> head(static_cast<std::size_t>(std::min<std::uint64_t>(file->size(), kPreambleBytes + 4)));
  SMLA_RETURN_IF_ERROR(file->read(0, head.data(), head.size()));
  if (head.size() >= kPreambleBytes + 2 && std::memcmp(head.data(), kMagic.data(), kMagic.size()) == 0) {
    const std::size_t length_bytes = static_cast<unsigned>(head[6]) == 1 ? 2 : 4;
    if (head.size() >= kPreambleBytes + length_bytes) {
      const std::size_t header_len = read_le(head, kPreambleBytes, length_bytes);
      const std::uint64_t wanted = std::min<std::uint64_t>(
          file->size(), kPreambleBytes + length_bytes + std::min<std::size_t>(header_len, kMaxHeaderBytes));
      head.resize(static_cast<std::size_t>(wanted));
      SMLA_RETURN_IF_ERROR(file->read(0, head.data(), head.size()));
    }
  }
  auto header = parse_npy_header(head, name);
  if (!header) return header.status();
  SMLA_RETURN_IF_ERROR(check_data_size(*header, file->size() - header->data_offset, name));
  SMLA_RETURN_IF_ERROR(
      check_allocation(name, "array data", static_cast<long double>(header->data_bytes)));
  NpyArray array;
  array.dtype = header->dtype;
  array.shape = header->shape;
  array.data.resize(static_cast<std::size_t>(header->data_bytes));
  SMLA_RETURN_IF_ERROR(file->read(header->data_offset, array.data.data(), array.data.size()));
  return array;
}

std::vector<std::byte> serialize_npy(const NpyArray& array) {
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_dtype_descr(array.dtype), shape_text(array.shape));
  const bool version2 = header.size() + kPreambleBytes + 2 + 1 > 65535;
  const std::size_t prefix = kPreambleBytes + (version2 ? 4 : 2);
  const std::size_t unpadded = prefix + header.size() + 1;  // + the closing newline
  header.append((kHeaderAlign - unpadded % kHeaderAlign) % kHeaderAlign, ' ');
  header.push_back('\n');

  std::vector<std::byte> bytes;
  bytes.reserve(prefix + header.size() + array.data.size());
  for (unsigned char c : kMagic) bytes.push_back(std::byte{c});
  bytes.push_back(std::byte{static_cast<unsigned char>(version2 ? 2 : 1)});
  bytes.push_back(std::byte{0});
  for (std::size_t i = 0; i < (version2 ? 4u : 2u); ++i) {
    bytes.push_back(std::byte{static_cast<unsigned char>((header.size() >> (8 * i)) & 0xFF)});
  }
  for (char c : header) bytes.push_back(static_cast<std::byte>(c));
  bytes.insert(bytes.end(), array.data.begin(), array.data.end());
  return bytes;
}

Status write_npy(const std::filesystem::path& path, const NpyArray& array) {
  const std::vector<std::byte> bytes = serialize_npy(array);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return npy_error(path.string(), "cannot open for writing");
  file.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!file) return npy_error(path.string(), "write failed");
  return Status::Ok();
}

Expected<NpyDType> npy_dtype_for(DType dtype, std::string_view name) {
  switch (dtype) {
    case DType::kBF16: return NpyDType::kU16;
    case DType::kE4M3:
    case DType::kU8: return NpyDType::kU8;
    case DType::kI32: return NpyDType::kI32;
    case DType::kI64: return NpyDType::kI64;
    case DType::kF32: return NpyDType::kF32;
    case DType::kF64: return NpyDType::kF64;
    case DType::kF16: break;
  }
  return invalid_argument(name, "a dtype .npy can hold (bf16, e4m3, u8, i32, i64, f32, f64)", dtype_name(dtype));
}

Expected<NpyArray> npy_from_tensor(const TensorView& tensor, std::string_view name) {
  if (!tensor.present()) return invalid_argument(name, "a tensor", "an absent tensor");
  if (tensor.device.kind != DeviceKind::kCpu) {
    return invalid_argument(name, "a CPU tensor", device_kind_name(tensor.device.kind));
  }
  auto dtype = npy_dtype_for(tensor.dtype, name);
  if (!dtype) return dtype.status();
  if (tensor.numel() > 0 && tensor.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  NpyArray array;
  array.dtype = *dtype;
  array.shape.assign(tensor.shape.begin(), tensor.shape.begin() + tensor.rank);
  const std::size_t item = dtype_size(tensor.dtype);
  array.data.resize(static_cast<std::size_t>(tensor.numel()) * item);
  const auto* base = static_cast<const std::byte*>(tensor.data);
  std::byte* dst = array.data.data();
  for_each_element_offset(tensor, [&](std::int64_t offset) {
    std::memcpy(dst, base + offset * static_cast<std::int64_t>(item), item);
    dst += item;
  });
  return array;
}

}  // namespace smla::cli
