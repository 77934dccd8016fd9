#include "tools/smla/manifest.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/common/test_common.h"
#include "tests/unit/tools/scoped_dir.h"
#include "tests/unit/tools/small_case.h"
#include "testkit/testkit.h"
#include "tools/smla/npy.h"
#include "tools/smla/replay.h"

namespace smla::cli {
namespace {

using nlohmann::json;
using smla::testing::FailsWith;

json decode_manifest() {
  return {{"op", "sparse_decode"},       {"format", "v4-fp8"},          {"softmax_scale", 0.0441941738},
          {"q", "q.npy"},                {"main_cache", "main_cache.npy"}, {"main_indices", "main_indices.npy"},
          {"extra_cache", "extra_cache.npy"}, {"extra_indices", "extra_indices.npy"}};
}

Expected<ReplayManifest> parse(const json& manifest) { return parse_manifest(manifest.dump(), "m.json"); }

TEST(Manifest, ParsesDecodeWithDefaults) {
  auto m = parse(decode_manifest());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->op, ReplayOp::kSparseDecode);
  EXPECT_EQ(m->format, KvFormat::kV4Fp8);
  EXPECT_FLOAT_EQ(m->softmax_scale, 0.0441941738f);
  EXPECT_EQ(m->main_cache, "main_cache.npy");
  EXPECT_EQ(m->extra_indices.value_or(""), "extra_indices.npy");
  EXPECT_FALSE(m->main_lengths.has_value());
  EXPECT_FALSE(m->sink.has_value());
  EXPECT_FALSE(m->main_page_stride_bytes.has_value());
  EXPECT_EQ(m->fp8_scale, 1.0f);
}

TEST(Manifest, ParsesPrefillAndComments) {
  json manifest = {{"op", "sparse_prefill"}, {"softmax_scale", 0.5}, {"q", "q.npy"},   {"kv", "kv.npy"},
                   {"indices", "i.npy"},     {"topk_length", "t.npy"}, {"d_v", 256}, {"_note", {"free", "form"}}};
  auto m = parse(manifest);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->op, ReplayOp::kSparsePrefill);
  EXPECT_EQ(m->d_v, 256);
  EXPECT_EQ(m->topk_length.value_or(""), "t.npy");
  manifest.erase("d_v");
  EXPECT_EQ(parse(manifest)->d_v, 512);
}

TEST(Manifest, JsonRoundTrip) {
  json manifest = decode_manifest();
  manifest["format"] = "fp8-rows";
  manifest["fp8_scale"] = 0.25;
  manifest["main_lengths"] = "ml.npy";
  manifest["sink"] = "sink.npy";
  manifest["main_page_stride_bytes"] = 40000;
  auto m = parse(manifest);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto again = parse_manifest(manifest_to_json(*m), "again.json");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(json::parse(manifest_to_json(*again)), json::parse(manifest_to_json(*m)));
  EXPECT_EQ(again->fp8_scale, 0.25f);
  EXPECT_EQ(again->main_page_stride_bytes.value_or(0), 40000);
  EXPECT_EQ(again->sink.value_or(""), "sink.npy");
}

// Each broken manifest fails with a message naming the file and the key.
void expect_manifest_error(const json& manifest, const std::vector<std::string>& needles) {
  std::vector<std::string> all = needles;
  all.push_back("m.json");
  EXPECT_TRUE(FailsWith(parse(manifest).status(), StatusCode::kInvalidArgument, all)) << manifest.dump();
}

TEST(ManifestErrors, MissingKeys) {
  for (const char* key : {"op", "format", "softmax_scale", "q", "main_cache", "main_indices"}) {
    json manifest = decode_manifest();
    manifest.erase(key);
    expect_manifest_error(manifest, {std::string("'") + key + "'", "no such key"});
  }
  json no_indices = decode_manifest();
  no_indices.erase("extra_indices");
  expect_manifest_error(no_indices, {"'extra_indices'"});
  json no_cache = decode_manifest();
  no_cache.erase("extra_cache");
  expect_manifest_error(no_cache, {"'extra_cache'"});
}

TEST(ManifestErrors, WrongTypes) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"softmax_scale", "0.1"}, {"q", 3},      {"main_cache", json::array()}, {"format", 4},
      {"fp8_scale", "one"},     {"op", true},  {"main_page_stride_bytes", 1.5},
      {"main_page_stride_bytes", -8}, {"sink", json::object()}, {"softmax_scale", 1e300}};
  for (const auto& [key, value] : cases) {
    json manifest = decode_manifest();
    manifest[key] = value;
    expect_manifest_error(manifest, {"'" + key + "'"});
  }
}

TEST(ManifestErrors, UnknownOpFormatOrKey) {
  json manifest = decode_manifest();
  manifest["op"] = "dense_decode";
  expect_manifest_error(manifest, {"'op'", "dense_decode", "sparse_decode or sparse_prefill"});
  manifest = decode_manifest();
  manifest["format"] = "v4-fp4";
  expect_manifest_error(manifest, {"'format'", "v4-fp4"});
  manifest = decode_manifest();
  manifest["main_length"] = "typo.npy";
  expect_manifest_error(manifest, {"'main_length'", "unknown key"});
  manifest = decode_manifest();
  manifest["kv"] = "kv.npy";  // a prefill key in a decode manifest
  expect_manifest_error(manifest, {"'kv'", "sparse_decode"});
}

TEST(ManifestErrors, NotJsonOrNotAnObject) {
  EXPECT_TRUE(FailsWith(parse_manifest("{\"op\": ", "m.json").status(), StatusCode::kInvalidArgument,
                        {"m.json", "JSON"}));
  EXPECT_TRUE(FailsWith(parse_manifest("[1, 2]", "m.json").status(), StatusCode::kInvalidArgument,
                        {"m.json", "object"}));
  ScopedDir dir("manifest_missing");
  EXPECT_TRUE(FailsWith(read_manifest(dir.path()).status(), StatusCode::kInvalidArgument, {"manifest.json"}));
}

// Errors found while loading the files a valid manifest names.
class ReplayInputErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    testkit::DecodeCase batch = testkit::make_decode_case(small_case_options(5));
    ASSERT_TRUE(write_replay_case(dir_.path(), batch.args()).ok());
    std::ifstream in(dir_ / "manifest.json");
    manifest_ = json::parse(in);
  }

  Status replay_with(const json& manifest) {
    std::ofstream(dir_ / "manifest.json", std::ios::trunc) << manifest.dump();
    return replay_case(dir_.path(), dir_ / "out", Backend::kReference).status();
  }
  void replace_file(const std::string& file, const NpyArray& array) { ASSERT_TRUE(write_npy(dir_ / file, array).ok()); }

  ScopedDir dir_{"replay_errors"};
  json manifest_;
};

TEST_F(ReplayInputErrors, MissingFileNamesTheKey) {
  json manifest = manifest_;
  manifest["extra_indices"] = "nowhere.npy";
  EXPECT_TRUE(FailsWith(replay_with(manifest), StatusCode::kInvalidArgument, {"'extra_indices'", "nowhere.npy", "not found"}));
}

TEST_F(ReplayInputErrors, ShapeMismatchNamesTheKey) {
  NpyArray indices{NpyDType::kI32, {3, 8}, std::vector<std::byte>(3 * 8 * 4)};  // T is 2
  replace_file("main_indices.npy", indices);
  EXPECT_TRUE(FailsWith(replay_with(manifest_), StatusCode::kInvalidArgument, {"'main_indices'", "T=2", "[3, 8]"}));

  NpyArray sink{NpyDType::kF32, {5}, std::vector<std::byte>(5 * 4)};  // h_q is 2
  replace_file("sink.npy", sink);
  json manifest = manifest_;
  manifest["main_indices"] = "extra_indices.npy";  // [2, 4] is a fine main index list
  manifest["sink"] = "sink.npy";
  EXPECT_TRUE(FailsWith(replay_with(manifest), StatusCode::kInvalidArgument, {"'sink'", "h_q=2", "[5]"}));
}

TEST_F(ReplayInputErrors, CacheRowOrDTypeMismatch) {
  NpyArray cache{NpyDType::kU8, {2, 4, 656}, std::vector<std::byte>(2 * 4 * 656)};  // a V3.2 cache under v4-fp8
  replace_file("other_cache.npy", cache);
  json manifest = manifest_;
  manifest["main_cache"] = "other_cache.npy";
  EXPECT_TRUE(FailsWith(replay_with(manifest), StatusCode::kInvalidArgument, {"'main_cache'", "584", "v4-fp8", "656"}));

  NpyArray q{NpyDType::kI32, {2, 2, 512}, std::vector<std::byte>(2 * 2 * 512 * 4)};
  replace_file("q_int.npy", q);
  manifest = manifest_;
  manifest["q"] = "q_int.npy";
  EXPECT_TRUE(FailsWith(replay_with(manifest), StatusCode::kInvalidArgument, {"'q'", "'<u2'", "'<i4'"}));
}

TEST_F(ReplayInputErrors, PageStrideTooSmall) {
  json manifest = manifest_;
  manifest["main_page_stride_bytes"] = 4 * 584 - 1;
  EXPECT_TRUE(FailsWith(replay_with(manifest), StatusCode::kInvalidArgument, {"'main_page_stride_bytes'", "2336", "2335"}));
}

TEST_F(ReplayInputErrors, MalformedNpyNamesTheKeyAndFile) {
  std::ofstream(dir_ / "q.npy", std::ios::trunc) << "\x93NUMPY\x01";
  EXPECT_TRUE(FailsWith(replay_with(manifest_), StatusCode::kInvalidArgument, {"'q'", "q.npy", "truncated"}));
}

}  // namespace
}  // namespace smla::cli
