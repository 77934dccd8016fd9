// Issue 15: hostile and careless inputs to the smla tool's readers. Each test
// is one item found by hand; each must end in a Status naming the file (and
// key), never in a crash, a huge allocation or a misleading message.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/common/test_common.h"
#include "tests/unit/tools/scoped_dir.h"
#include "tests/unit/tools/small_case.h"
#include "testkit/testkit.h"
#include "tools/smla/input_files.h"
#include "tools/smla/manifest.h"
#include "tools/smla/npy.h"
#include "tools/smla/plan_batch.h"
#include "tools/smla/replay.h"

namespace smla::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using smla::testing::FailsWith;

void write_text(const fs::path& path, std::string_view text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// A small decode case written as a replay directory.
class HostileReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    batch_ = std::make_unique<testkit::DecodeCase>(testkit::make_decode_case(small_case_options(15)));
    ASSERT_TRUE(write_replay_case(dir_.path(), batch_->args()).ok());
    std::ifstream in(dir_ / "manifest.json");
    manifest_ = json::parse(in);
  }
  Status replay_with(const json& manifest) {
    write_text(dir_ / "manifest.json", manifest.dump());
    return replay_case(dir_.path(), dir_ / "out", Backend::kReference).status();
  }

  ScopedDir dir_{"hostile_replay"};
  std::unique_ptr<testkit::DecodeCase> batch_;
  json manifest_;
};

// --- crashes ---------------------------------------------------------------

TEST_F(HostileReplay, HugePageStrideIsRefusedBeforeAllocating) {
  json manifest = manifest_;
  manifest["extra_page_stride_bytes"] = 9663676416;  // 9 GiB per page: the relayout would take tens of GiB
  const auto start = std::chrono::steady_clock::now();
  const Status status = replay_with(manifest);
  EXPECT_TRUE(FailsWith(status, StatusCode::kInvalidArgument,
                        {"'extra_page_stride_bytes'", "relayout", "host allocation limit", "asked for"}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HostileNpy, FilePaddedTo8GBIsRefusedWithoutReadingIt) {
  ScopedDir dir("npy_padded");
  NpyArray array{NpyDType::kF32, {2}, std::vector<std::byte>(8)};
  ASSERT_TRUE(write_npy(dir / "big.npy", array).ok());
  std::error_code error;
  fs::resize_file(dir / "big.npy", std::uint64_t{8} << 30, error);  // sparse: no disk space used
  if (error) GTEST_SKIP() << "cannot make a sparse 8 GB file here: " << error.message();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(FailsWith(read_npy(dir / "big.npy").status(), StatusCode::kInvalidArgument,
                        {"big.npy", "needs 8 data bytes", "the file holds 85899"}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(HostileNpy, HeaderAskingForMoreThanTheLimitIsRefused) {
  // A consistent header and file whose data is beyond the allocation limit: checked before allocating.
  ScopedDir dir("npy_huge");
  std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (17179869185,), }";  // 16 GiB + 1
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string text = "\x93NUMPY\x01";
  text.push_back('\0');
  text.push_back(static_cast<char>(header.size() & 0xFF));
  text.push_back(static_cast<char>(header.size() >> 8));
  text += header;
  write_text(dir / "huge.npy", text);
  std::error_code error;
  fs::resize_file(dir / "huge.npy", text.size() + 17179869185ull, error);
  if (error) GTEST_SKIP() << "cannot make a sparse 16 GB file here: " << error.message();
  EXPECT_TRUE(FailsWith(read_npy(dir / "huge.npy").status(), StatusCode::kInvalidArgument,
                        {"huge.npy", "host allocation limit", "17179869185 bytes"}));
}

// --- values accepted silently -------------------------------------------------

TEST(HostileManifest, FileNameWithNulIsRefused) {
  const std::string text =
      R"({"op": "sparse_decode", "format": "v4-fp8", "softmax_scale": 0.04, "q": "q.npy\u0000.txt",)"
      R"( "main_cache": "c.npy", "main_indices": "i.npy"})";
  const Status status = parse_manifest(text, "m.json").status();
  EXPECT_TRUE(FailsWith(status, StatusCode::kInvalidArgument, {"m.json", "'q'", "NUL", "q.npy\\x00.txt"}));
  EXPECT_EQ(status.message().find('\0'), std::string::npos);
}

TEST(HostileManifest, Fp8ScaleOnlyWithFp8Rows) {
  json manifest = {{"op", "sparse_decode"}, {"format", "v4-fp8"}, {"softmax_scale", 0.04}, {"q", "q.npy"},
                   {"main_cache", "c.npy"}, {"main_indices", "i.npy"}, {"fp8_scale", 2.0}};
  EXPECT_TRUE(FailsWith(parse_manifest(manifest.dump(), "m.json").status(), StatusCode::kInvalidArgument,
                        {"m.json", "'fp8_scale'", "fp8-rows", "v4-fp8"}));
  manifest["format"] = "fp8-rows";
  auto ok = parse_manifest(manifest.dump(), "m.json");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->fp8_scale, 2.0f);
}

Status plan_batch_error(const std::string& text) { return parse_plan_batch(text, "batch.json").status(); }

TEST(HostilePlanBatch, IntegersAreCheckedNotWrapped) {
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": [{"query_len": 4294967297, "seq_len": 5}]})"),
                        StatusCode::kInvalidArgument, {"batch.json", "requests[0].query_len", "4294967297"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": [{"query_len": 1.9, "seq_len": 5}]})"),
                        StatusCode::kInvalidArgument, {"requests[0].query_len", "an integer", "1.9"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": [{"query_len": true, "seq_len": 5}]})"),
                        StatusCode::kInvalidArgument, {"requests[0].query_len", "a boolean"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": [{"query_len": 1, "seq_len": -5}]})"),
                        StatusCode::kInvalidArgument, {"requests[0].seq_len", "-5"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"config": {"window": 4294967424}, "requests": []})"),
                        StatusCode::kInvalidArgument, {"config.window", "4294967424"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"token_valid": [1, 256], "requests": []})"),
                        StatusCode::kInvalidArgument, {"token_valid[1]", "[0, 1]", "256"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": [{"query_len": 1, "seq_len": 5, "c4_block_table": [1, 2.5]}]})"),
                        StatusCode::kInvalidArgument, {"requests[0].c4_block_table[1]", "2.5"}));
}

TEST(HostilePlanBatch, UnknownKeysGroupsAndShapesAreErrors) {
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"request": [], "requests": []})"), StatusCode::kInvalidArgument,
                        {"batch.json", "request", "unknown key"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"config": {"windw": 3}, "requests": []})"),
                        StatusCode::kInvalidArgument, {"config.windw", "unknown key"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": [{"query_len": 1, "seq_len": 5, "swa_table": []}]})"),
                        StatusCode::kInvalidArgument, {"requests[0].swa_table", "unknown key"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"groups": ["c4", "c64"], "requests": []})"),
                        StatusCode::kInvalidArgument, {"groups[1]", "\"c64\""}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"requests": {"query_len": 1, "seq_len": 5}})"),
                        StatusCode::kInvalidArgument, {"requests", "an array", "an object"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"groups": ["c4"], "requests": [{"query_len": 1, "seq_len": 5,
                                             "c128_block_table": [0]}]})"),
                        StatusCode::kInvalidArgument, {"requests[0].c128_block_table", "c128"}));
  EXPECT_TRUE(FailsWith(plan_batch_error(R"({"config": {}})"), StatusCode::kInvalidArgument, {"requests", "no such key"}));
  // Comments are still free-form, and a valid batch parses.
  auto ok = parse_plan_batch(R"({"_why": "a note", "groups": ["c128"],
                                 "requests": [{"query_len": 1, "seq_len": 5, "swa_block_table": [3]}]})",
                             "batch.json");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_FALSE(ok->has_c4);
  EXPECT_TRUE(ok->has_c128);
  EXPECT_EQ(ok->given[0][0], std::vector<std::int32_t>{3});
}

// --- unclear messages --------------------------------------------------------

TEST(HostileNpy, NonRegularFilesAreNamedAsSuch) {
  ScopedDir dir("npy_kinds");
  fs::create_directory(dir / "dir.npy");
  EXPECT_TRUE(FailsWith(read_npy(dir / "dir.npy").status(), StatusCode::kInvalidArgument, {"dir.npy", "a directory"}));
  ASSERT_EQ(::mkfifo((dir / "fifo.npy").c_str(), 0600), 0);
  EXPECT_TRUE(FailsWith(read_npy(dir / "fifo.npy").status(), StatusCode::kInvalidArgument, {"fifo.npy", "FIFO"}));
  EXPECT_TRUE(FailsWith(read_npy("/dev/zero").status(), StatusCode::kInvalidArgument,
                        {"/dev/zero", "a character device"}));
  fs::create_symlink(dir / "loop_b.npy", dir / "loop_a.npy");
  fs::create_symlink(dir / "loop_a.npy", dir / "loop_b.npy");
  EXPECT_TRUE(FailsWith(read_npy(dir / "loop_a.npy").status(), StatusCode::kInvalidArgument,
                        {"loop_a.npy", "symbolic link loop"}));
  EXPECT_TRUE(FailsWith(read_npy(dir / "missing.npy").status(), StatusCode::kInvalidArgument,
                        {"missing.npy", "file not found"}));
}

TEST(HostileNpy, NulInTheHeaderIsEscaped) {
  std::string text = "\x93NUMPY\x01";
  text.push_back('\0');
  const std::string dict = std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x\0y': 1}", 65);
  text.push_back(static_cast<char>(dict.size() + 1));
  text.push_back('\0');
  text += dict + "\n";
  text.append(4, '\0');
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  const Status status = parse_npy(bytes, "nul.npy").status();
  EXPECT_TRUE(FailsWith(status, StatusCode::kInvalidArgument, {"nul.npy", "unknown header key 'x\\x00y'"}));
  EXPECT_EQ(status.message().find('\0'), std::string::npos);
}

TEST(HostileManifest, DirectoryOrMissingCaseIsNamed) {
  ScopedDir dir("manifest_kinds");
  fs::create_directory(dir / "manifest.json");
  EXPECT_TRUE(FailsWith(read_manifest(dir.path()).status(), StatusCode::kInvalidArgument,
                        {"manifest.json", "a directory"}));
  write_text(dir / "plain", "x");
  EXPECT_TRUE(FailsWith(read_manifest(dir / "plain").status(), StatusCode::kInvalidArgument,
                        {"plain", "case directory", "a regular file"}));
  EXPECT_TRUE(FailsWith(read_manifest(dir / "nowhere").status(), StatusCode::kInvalidArgument,
                        {"nowhere", "no such directory"}));
}

TEST(HostileManifest, UnreadableCaseDirectoryIsNotNoSuchFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any directory";
  ScopedDir dir("manifest_unreadable");
  fs::create_directory(dir / "case");
  write_text(dir / "case" / "manifest.json", "{}");
  fs::permissions(dir / "case", fs::perms::none);
  const Status status = read_manifest(dir / "case").status();
  fs::permissions(dir / "case", fs::perms::owner_all);
  EXPECT_TRUE(FailsWith(status, StatusCode::kInvalidArgument, {"case", "permission denied"}));
}

TEST(HostileManifest, ParseErrorsGiveLineAndColumn) {
  const std::string text = "{\n  \"op\": \"sparse_decode\",\n  \"format\": v4\n}";
  EXPECT_TRUE(FailsWith(parse_manifest(text, "m.json").status(), StatusCode::kInvalidArgument,
                        {"m.json", "line 3, column 13"}));
  EXPECT_TRUE(FailsWith(parse_plan_batch("{\"requests\": [1,, 2]}", "b.json").status(), StatusCode::kInvalidArgument,
                        {"b.json", "line 1, column 17"}));
}

TEST(HostileManifest, UnknownKeyIsEscaped) {
  const std::string text =
      R"({"op": "sparse_decode", "format": "v4-fp8", "softmax_scale": 0.04, "q": "q.npy", "main_cache": "c.npy",)"
      R"( "main_indices": "i.npy", "bad\u001bkey": 1})";
  const Status status = parse_manifest(text, "m.json").status();
  EXPECT_TRUE(FailsWith(status, StatusCode::kInvalidArgument, {"'bad\\x1bkey'", "unknown key"}));
}

TEST_F(HostileReplay, LibraryErrorsNameTheFile) {
  // A length beyond the index list: found by the library's checks, reported with the file it came from.
  NpyArray lengths{NpyDType::kI32, {2}, std::vector<std::byte>(8)};
  const std::int32_t values[2] = {1, 9};  // k_main is 8
  std::memcpy(lengths.data.data(), values, sizeof values);
  ASSERT_TRUE(write_npy(dir_ / "bad_lengths.npy", lengths).ok());
  json manifest = manifest_;
  manifest["main_lengths"] = "bad_lengths.npy";
  const Status status = replay_with(manifest);
  EXPECT_TRUE(FailsWith(status, StatusCode::kOutOfRange, {"manifest.json", "'main_lengths'", "bad_lengths.npy",
                                                               "main_lengths[1]"}))
      << status.to_string();
}

TEST_F(HostileReplay, CheckOfTheWrongShapeGivesBothShapes) {
  ASSERT_TRUE(replay_with(manifest_).ok());
  ScopedDir want("hostile_want");
  NpyArray out{NpyDType::kU16, {2, 2, 256}, std::vector<std::byte>(2 * 2 * 256 * 2)};
  ASSERT_TRUE(write_npy(want / "out.npy", out).ok());
  EXPECT_TRUE(FailsWith(check_replay_outputs(dir_ / "out", want.path()).status(), StatusCode::kInvalidArgument,
                        {"out.npy", "[2, 2, 512]", "[2, 2, 256]"}));
}

TEST(InputFiles, PrintableEscapesEverythingOutsideAscii) {
  EXPECT_EQ(printable(std::string("a\0b\n\\\x7f\xff", 7)), "a\\x00b\\x0a\\\\\\x7f\\xff");
  EXPECT_EQ(printable("plain text"), "plain text");
}

}  // namespace
}  // namespace smla::cli
