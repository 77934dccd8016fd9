#include "tools/smla/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include "tests/common/test_common.h"
#include "tests/unit/tools/scoped_dir.h"

namespace smla::cli {
namespace {

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

// A version 1.0 file with the given header dict text (padded the way NumPy pads) and data bytes.
std::vector<std::byte> npy_file(std::string_view dict, std::size_t data_bytes, int major = 1) {
  std::string header(dict);
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string file = "\x93NUMPY";
  file.push_back(static_cast<char>(major));
  file.push_back('\0');
  for (std::size_t i = 0; i < prefix - 8; ++i) file.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  file += header;
  file.append(data_bytes, '\x01');
  return bytes_of(file);
}

NpyArray random_array(NpyDType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = std::move(shape);
  array.data.resize(static_cast<std::size_t>(array.numel()) * npy_dtype_size(dtype));
  for (std::byte& b : array.data) b = static_cast<std::byte>(rng() & 0xFF);
  return array;
}

class NpyRoundTrip : public ::testing::TestWithParam<NpyDType> {};

TEST_P(NpyRoundTrip, WriteThenReadGivesTheSameArray) {
  const std::uint64_t seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 5}, {4, 0, 2}};
  for (const auto& shape : shapes) {
    const NpyArray array = random_array(GetParam(), shape, rng);
    const std::vector<std::byte> bytes = serialize_npy(array);
    // Layout NumPy expects: magic, version 1.0, header padded so the data starts on a 64-byte boundary.
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8), 0);
    const std::size_t header_len = static_cast<std::size_t>(bytes[8]) | (static_cast<std::size_t>(bytes[9]) << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(static_cast<char>(bytes[10 + header_len - 1]), '\n');
    EXPECT_EQ(bytes.size(), 10 + header_len + array.data.size());

    auto parsed = parse_npy(bytes, "round-trip");
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    EXPECT_EQ(parsed->dtype, array.dtype);
    EXPECT_EQ(parsed->shape, array.shape);
    EXPECT_EQ(parsed->data, array.data);
  }
}

TEST_P(NpyRoundTrip, ThroughAFile) {
  std::mt19937_64 rng(testing::test_seed());
  const NpyArray array = random_array(GetParam(), {3, 4}, rng);
  const ScopedDir dir("npy");
  const auto path = dir / "array.npy";
  ASSERT_TRUE(write_npy(path, array).ok());
  auto read = read_npy(path);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->data, array.data);
  EXPECT_EQ(read->shape, array.shape);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, NpyRoundTrip,
                         ::testing::Values(NpyDType::kU8, NpyDType::kU16, NpyDType::kI32, NpyDType::kI64,
                                           NpyDType::kF32, NpyDType::kF64),
                         [](const auto& param_info) { return std::string(npy_dtype_descr(param_info.param)).substr(1); });

TEST(Npy, ReadsAFileLaidOutLikeNumPySaveWritesIt) {
  // np.save(f, np.array([1, -2, 3], dtype='<i4')) with NumPy 1.x.
  auto bytes = npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", 0);
  ASSERT_EQ(bytes.size(), 128u);
  const std::int32_t values[3] = {1, -2, 3};
  const auto* raw = reinterpret_cast<const std::byte*>(values);
  bytes.insert(bytes.end(), raw, raw + sizeof values);
  auto array = parse_npy(bytes, "x.npy");
  ASSERT_TRUE(array.ok()) << array.status().to_string();
  EXPECT_EQ(array->dtype, NpyDType::kI32);
  ASSERT_EQ(array->shape, std::vector<std::int64_t>{3});
  EXPECT_EQ(array->as<std::int32_t>()[1], -2);
}

TEST(Npy, ReadsVersions2And3AndOtherSpellings) {
  for (int major : {2, 3}) {
    auto array = parse_npy(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", 32, major), "v.npy");
    ASSERT_TRUE(array.ok()) << array.status().to_string();
    EXPECT_EQ(array->shape, (std::vector<std::int64_t>{2, 2}));
  }
  // Key order, double quotes, '<u1', no trailing comma, Python 2 long suffix.
  auto array = parse_npy(npy_file(R"({"shape": (2L, 3), "fortran_order": False, "descr": "<u1"})", 6), "o.npy");
  ASSERT_TRUE(array.ok()) << array.status().to_string();
  EXPECT_EQ(array->dtype, NpyDType::kU8);
  EXPECT_EQ(array->shape, (std::vector<std::int64_t>{2, 3}));
}

// Every malformed file yields an error naming the file and the problem.
void expect_error(const std::vector<std::byte>& bytes, std::string_view fragment) {
  auto array = parse_npy(bytes, "bad.npy");
  ASSERT_FALSE(array.ok()) << "accepted a malformed file; expected an error about '" << fragment << "'";
  const std::string& message = array.status().message();
  EXPECT_NE(message.find("bad.npy"), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
}

TEST(NpyMalformed, EveryTruncationIsAnError) {
  const auto good = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  ASSERT_TRUE(parse_npy(good, "good.npy").ok());
  for (std::size_t size = 0; size < good.size(); ++size) {
    const std::vector<std::byte> prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(size));
    auto array = parse_npy(prefix, "cut.npy");
    EXPECT_FALSE(array.ok()) << "accepted a file cut to " << size << " bytes";
  }
  expect_error({good.begin(), good.begin() + 5}, "truncated");
  expect_error({good.begin(), good.begin() + 60}, "truncated");
}

TEST(NpyMalformed, BadMagicAndVersion) {
  auto bytes = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  auto wrong_magic = bytes;
  wrong_magic[1] = std::byte{'X'};
  expect_error(wrong_magic, "bad magic");
  auto wrong_version = bytes;
  wrong_version[6] = std::byte{4};
  expect_error(wrong_version, "version 4.0");
  expect_error(bytes_of("PK\x03\x04 this is a zip file"), "bad magic");
}

TEST(NpyMalformed, HeaderThatIsNotADict) {
  expect_error(npy_file("['descr', '<f4']", 0), "not a Python dict");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), ", 4), "expected");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing", 4), "after the header");
  expect_error(npy_file("{'descr': '<f4', 'shape': (1,)}", 4), "'fortran_order'");
  expect_error(npy_file("{'fortran_order': False, 'shape': (1,)}", 4), "'descr'");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False}", 4), "'shape'");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4), "unknown header key");
  expect_error(npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4), "duplicate");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4), "True or False");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", 4), "tuple");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 4), "non-negative");
  expect_error(npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4), "structured");
  expect_error(npy_file("{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", 4), "unsupported dtype");
}

TEST(NpyMalformed, ShapeThatDoesNotMatchTheData) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expect_error(npy_file(dict, 23), "needs 24 data bytes, the file holds 23");
  expect_error(npy_file(dict, 25), "needs 24 data bytes, the file holds 25");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2, 2, 2), }", 128), "rank above 4");
  expect_error(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (281474976710656, 281474976710656), }", 0),
               "too large");
  expect_error(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0), "too large");
}

TEST(NpyMalformed, UnsupportedDTypesAndFortranOrder) {
  expect_error(npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", 2), "float16");
  expect_error(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4), "big-endian");
  expect_error(npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }", 1), "unsupported dtype '|b1'");
  expect_error(npy_file("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8), "unsupported dtype");
  expect_error(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16), "fortran_order True");
}

TEST(NpyMalformed, MissingFileIsAnError) {
  auto array = read_npy("/nonexistent/smla/none.npy");
  ASSERT_FALSE(array.ok());
  EXPECT_NE(array.status().message().find("/nonexistent/smla/none.npy"), std::string::npos);
}

TEST(Npy, FromTensorCopiesAStridedViewInRowMajorOrder) {
  // A [2, 3] view over rows of 5 elements: the padding must not appear in the array.
  std::int32_t storage[10];
  for (int i = 0; i < 10; ++i) storage[i] = 100 + i;
  const TensorView view = TensorView::strided(storage, DType::kI32, {2, 3}, {5, 1});
  auto array = npy_from_tensor(view, "v");
  ASSERT_TRUE(array.ok()) << array.status().to_string();
  EXPECT_EQ(array->shape, (std::vector<std::int64_t>{2, 3}));
  const std::int32_t expected[6] = {100, 101, 102, 105, 106, 107};
  ASSERT_EQ(array->data.size(), sizeof expected);
  EXPECT_EQ(std::memcmp(array->data.data(), expected, sizeof expected), 0);

  std::uint16_t half[2] = {};
  auto refused = npy_from_tensor(TensorView::contiguous(half, DType::kF16, {2}), "h");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("h:"), std::string::npos);
  EXPECT_FALSE(npy_from_tensor(TensorView{}, "absent").ok());
}

}  // namespace
}  // namespace smla::cli
