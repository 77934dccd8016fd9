// `smla plan` driven through its CLI11 registration: JSON and pretty output of
// the spec 5.7 decode example, a batch file, and bad input (exit code 2).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "smla/metadata.h"
#include "tools/smla/commands.h"

namespace smla::testing {
namespace {

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path(::testing::TempDir() + name + std::to_string(::testing::UnitTest::GetInstance()->random_seed())) {}
  ~TempFile() { std::remove(path.c_str()); }
  std::string read() const {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

int run_plan(std::vector<std::string> args) {
  CLI::App app{"smla"};
  int exit_code = -1;
  cli::add_plan_command(app, exit_code);
  args.insert(args.begin(), {"smla", "plan"});
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return 2;
  }
  return exit_code;
}

TEST(MetadataPlanCli, DecodeExampleJson) {
  TempFile out("plan.json");
  ASSERT_EQ(run_plan({"--query-lens", "1", "--seq-lens", "1000", "-o", out.path}), 0);
  const auto j = nlohmann::json::parse(out.read());
  EXPECT_EQ(j["counts"]["num_decodes"], 1);
  // Pages allocated in order: SWA slot of position p is p.
  EXPECT_EQ(j["tokens"]["swa_lens"][0], 128);
  EXPECT_EQ(j["tokens"]["swa_indices"][0][0], 872);
  EXPECT_EQ(j["tokens"]["swa_indices"][0][127], 999);
  EXPECT_EQ(j["c128a"]["decode_lens"][0], 7);
  EXPECT_EQ(j["c128a"]["decode_indices"][0][6], 6);
  EXPECT_EQ(j["c128a"]["decode_indices"][0][7], -1);
  EXPECT_EQ(j["c128a"]["width"], 512);
  EXPECT_EQ(j["layers"]["c4a"]["static_workspace"]["indices"][1], 640);
}

TEST(MetadataPlanCli, PrettyAndBatchFile) {
  TempFile batch("batch.json"), out("plan.txt");
  {
    std::ofstream f(batch.path);
    f << R"({"config": {"window": 128, "index_topk": 512},
             "requests": [{"query_len": 200, "seq_len": 500, "swa_block_table": [7,6,5,4,3,2,1,0]}],
             "groups": ["c4"]})";
  }
  ASSERT_EQ(run_plan({"--batch", batch.path, "--pretty", "-o", out.path}), 0);
  const std::string text = out.read();
  EXPECT_NE(text.find("1 requests (0 decode, 1 prefill)"), std::string::npos) << text.substr(0, 400);
  EXPECT_NE(text.find("N=125 M=452 indices [200, 640]"), std::string::npos);
  // Token 0 (pos 300): window 173..300 = page 2 (slots 5*64+45..) then page 3, 4.
  EXPECT_NE(text.find("[128]: 365..383 256..319 192..236"), std::string::npos);
}

TEST(MetadataPlanCli, BadInputExitsTwo) {
  EXPECT_EQ(run_plan({"--query-lens", "5,1", "--seq-lens", "10,10"}), 2);     // not decode-first
  EXPECT_EQ(run_plan({"--query-lens", "5", "--seq-lens", "4"}), 2);           // context shorter than query
  EXPECT_EQ(run_plan({"--query-lens", "1,1", "--seq-lens", "4"}), 2);         // mismatched lists
  EXPECT_EQ(run_plan({"--query-lens", "1", "--seq-lens", "2000000000"}), 2);  // absurd length
  EXPECT_EQ(run_plan({"--batch", "/nonexistent/batch.json"}), 2);
  EXPECT_EQ(run_plan({}), 2);
}

// Issue 15: the batch file is read as strictly as the replay manifest.
TEST(MetadataPlanCli, StrictBatchFile) {
  TempFile batch("strict_batch.json");
  const auto exit_code_for = [&](const std::string& text) {
    {
      std::ofstream f(batch.path, std::ios::trunc);
      f << text;
    }
    ::testing::internal::CaptureStderr();
    const int code = run_plan({"--batch", batch.path});
    const std::string err = ::testing::internal::GetCapturedStderr();
    return std::make_pair(code, err);
  };
  for (const char* text : {R"({"requests": [{"query_len": 4294967297, "seq_len": 4294967297}]})",
                           R"({"requests": [{"query_len": 1.9, "seq_len": 5}]})",
                           R"({"requests": [{"query_len": true, "seq_len": 5}]})",
                           R"({"requests": [{"query_len": 1, "seq_len": 5}], "reqests": []})",
                           R"({"requests": [{"query_len": 1, "seq_len": 5}], "groups": ["c4", "c129"]})",
                           R"({"requests": {"0": {"query_len": 1, "seq_len": 5}}})",
                           R"({"requests": [{"query_len": 1, "seq_len": 5}], "token_valid": [2]})"}) {
    const auto [code, err] = exit_code_for(text);
    EXPECT_EQ(code, 2) << text;
    EXPECT_NE(err.find("strict_batch.json"), std::string::npos) << text << "\n" << err;
  }
  const auto [code, err] = exit_code_for(R"({"requests": [{"query_len": 1, "seq_len": 5}], "groups": ["c4"]})");
  EXPECT_EQ(code, 0) << err;
}

TEST(MetadataPlanCli, TokenValidIsZeroOrOne) {
  for (const char* values : {"1,256", "1,-1", "1,2"}) {
    EXPECT_EQ(run_plan({"--query-lens", "1,1", "--seq-lens", "10,10", "--token-valid", values}), 2) << values;
  }
  TempFile out("token_valid.json");
  ASSERT_EQ(run_plan({"--query-lens", "1,1", "--seq-lens", "10,10", "--token-valid", "1,0", "-o", out.path}), 0);
  const auto j = nlohmann::json::parse(out.read());
  EXPECT_EQ(j["tokens"]["is_valid_token"][1], 0);
  EXPECT_EQ(j["tokens"]["swa_slot_mapping"][1], -1);
}

// Found by fuzz_index_transforms: an empty index list ([n, 0]) with null data made
// the transform offset a null pointer per row (undefined; UBSan in the asan preset).
TEST(MetadataEmptyViews, NullDataEmptyRowsAreNotOffset) {
  std::int32_t req_id[2] = {0, 0};
  std::int32_t table[2] = {0, 1};
  const TensorView indices = TensorView::contiguous(nullptr, DType::kI32, {2, 0});
  const TensorView out = TensorView::contiguous(nullptr, DType::kI32, {2, 0});
  std::int32_t counts[2] = {-7, -7};
  ASSERT_TRUE(v32_request_to_global_indices(indices, TensorView::contiguous(req_id, DType::kI32, {2}),
                                            TensorView::contiguous(table, DType::kI32, {1, 2}), 64, 0, out,
                                            TensorView::contiguous(counts, DType::kI32, {2}))
                  .ok());
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 0);
}

}  // namespace
}  // namespace smla::testing
