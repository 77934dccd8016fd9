// Runs the built `smla` executable: exit codes and the main lines of its output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/common/test_common.h"
#include "tests/unit/tools/scoped_dir.h"
#include "tests/unit/tools/small_case.h"
#include "testkit/testkit.h"
#include "tools/smla/replay.h"

namespace smla::cli {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult run_smla(const std::string& arguments) {
  const std::string command = std::string(SMLA_CLI_PATH) + " " + arguments + " 2>&1";
  RunResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) != nullptr) result.output += buffer.data();
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(SmlaBinary, InfoListsFormatsAndBackends) {
  const RunResult text = run_smla("info");
  EXPECT_EQ(text.exit_code, 0) << text.output;
  for (const char* needle : {"v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows", "reference", "37440"}) {
    EXPECT_NE(text.output.find(needle), std::string::npos) << needle << "\n" << text.output;
  }

  const RunResult as_json = run_smla("info --json");
  ASSERT_EQ(as_json.exit_code, 0) << as_json.output;
  const auto info = nlohmann::json::parse(as_json.output, nullptr, false);
  ASSERT_FALSE(info.is_discarded()) << as_json.output;
  // Byte sizes from spec 2.2 / 2.4: 584 B per token, pages of 64 and 2 entries padded to 576 B.
  const auto& v4 = info["formats"][0];
  EXPECT_EQ(v4["name"], "v4-fp8");
  EXPECT_EQ(v4["bytes_per_token"], 584);
  EXPECT_EQ(v4["page_bytes"]["64"], 37440);
  EXPECT_EQ(v4["page_bytes"]["2"], 1728);
  EXPECT_EQ(info["formats"][1]["bytes_per_token"], 656);
  EXPECT_EQ(info["formats"][1]["head_dim"], 576);
  bool reference_listed = false;
  for (const auto& backend : info["backends"]) {
    reference_listed = reference_listed || (backend["name"] == "reference" && backend["available"] == true);
  }
  EXPECT_TRUE(reference_listed) << as_json.output;
}

TEST(SmlaBinary, AttnOnTheReferencePasses) {
  const RunResult result = run_smla(
      "attn --backend reference --requests 1 --tokens 2 --heads 2 --window 8 --extra-topk 8 --page-size 5 "
      "--extra-page-size 3 --context 24 --extra-context 12 --repeat 1 --random-lengths --seed " +
      std::to_string(smla::testing::test_seed() % 100000));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("out vs reference: PASS"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("tokens/s"), std::string::npos) << result.output;
}

TEST(SmlaBinary, BadOptionsExitWithTwo) {
  for (const char* arguments : {"attn --heads 0", "attn --format v5-fp8", "attn --backend gpu", "attn --repeat 0",
                                "attn --no-such-option", "replay /nonexistent/smla_case", "info --bogus", ""}) {
    const RunResult result = run_smla(arguments);
    EXPECT_EQ(result.exit_code, 2) << "smla " << arguments << "\n" << result.output;
  }
  const RunResult heads = run_smla("attn --heads 0");
  EXPECT_NE(heads.output.find("--heads"), std::string::npos) << heads.output;
}

TEST(SmlaBinary, ReplayWithCheck) {
  const testkit::DecodeCaseOptions options = small_case_options(smla::testing::test_seed(), /*extra_topk=*/0);
  SMLA_SEED_TRACE(options.seed);
  testkit::DecodeCase batch = testkit::make_decode_case(options);
  const SparseDecodeArgs args = batch.args();
  ASSERT_TRUE(sparse_decode(args, Backend::kReference).ok());
  const ScopedDir case_dir("cli_case"), out_dir("cli_out");
  ASSERT_TRUE(write_replay_case(case_dir.path(), args, /*with_outputs=*/true).ok());

  const std::string replay = "replay " + case_dir.path().string() + " --backend reference --out " +
                             out_dir.path().string() + " --check " + case_dir.path().string();
  const RunResult passing = run_smla(replay);
  EXPECT_EQ(passing.exit_code, 0) << passing.output;
  EXPECT_NE(passing.output.find("check out.npy: PASS"), std::string::npos) << passing.output;

  // A reference output far from the real one: the check fails with exit code 1.
  auto* out = static_cast<std::uint16_t*>(args.out.data);
  out[0] = static_cast<std::uint16_t>(out[0] ^ 0x4000);  // flips the top exponent bit
  ASSERT_TRUE(write_replay_case(case_dir.path(), args, /*with_outputs=*/true).ok());
  const RunResult failing = run_smla(replay);
  EXPECT_EQ(failing.exit_code, 1) << failing.output;
  EXPECT_NE(failing.output.find("check out.npy: FAIL"), std::string::npos) << failing.output;
}

// Issue 15: options and files that crashed the tool or were taken silently.
TEST(SmlaBinaryHostile, HugeAttnSizesAreRefusedNotCrashed) {
  for (const char* option : {"--page-size 2147483647", "--window 2147483647", "--extra-topk 2147483647",
                             "--requests 1000000000"}) {
    const std::string flag = std::string(option).substr(0, std::string(option).find(' '));
    const RunResult result = run_smla(std::string("attn --backend reference --repeat 1 ") + option);
    EXPECT_EQ(result.exit_code, 2) << option << "\n" << result.output;
    EXPECT_NE(result.output.find(flag), std::string::npos) << option << "\n" << result.output;
    EXPECT_NE(result.output.find("asked for"), std::string::npos) << option << "\n" << result.output;
  }
}

TEST(SmlaBinaryHostile, OptionsTakeExactlyTheirDocumentedValues) {
  for (const char* arguments : {"plan --query-lens 1,1 --seq-lens 10,10 --token-valid 1,256",
                                "plan --query-lens 1,1 --seq-lens 10,10 --token-valid 1,-1",
                                "plan --query-lens 1,1 --seq-lens 10,10 --token-valid 1,2",
                                "plan --query-lens 4294967297 --seq-lens 10",
                                "plan --query-lens 1 --seq-lens 10 --permute-seed -1",
                                "attn --seed -1", "attn --requests 1e9", "attn --tokens 1.5",
                                "demo --decode-steps 2000000000 --no-progress", "demo --decode-steps -1 --no-progress",
                                "demo --index-topk -5 --no-progress", "demo --tolerance nan --no-progress",
                                "demo --seed -1 --no-progress", "demo --prompts 2000000000 --no-progress"}) {
    const RunResult result = run_smla(arguments);
    EXPECT_EQ(result.exit_code, 2) << "smla " << arguments << "\n" << result.output;
  }
  const RunResult token = run_smla("plan --query-lens 1,1 --seq-lens 10,10 --token-valid 1,256");
  EXPECT_NE(token.output.find("--token-valid[1]: expected 0 or 1, got 256"), std::string::npos) << token.output;
  const RunResult valid = run_smla("plan --query-lens 1,1 --seq-lens 10,10 --token-valid 1,0");
  EXPECT_EQ(valid.exit_code, 0) << valid.output;
}

TEST(SmlaBinaryHostile, PlanBatchErrorsNameTheFileAndPath) {
  const ScopedDir dir("cli_plan_batch");
  std::ofstream(dir / "batch.json") << R"({"requests": [{"query_len": 4294967297, "seq_len": 5}]})";
  const RunResult result = run_smla("plan --batch " + (dir / "batch.json").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("batch.json: requests[0].query_len"), std::string::npos) << result.output;
  const RunResult directory = run_smla("plan --batch " + dir.path().string());
  EXPECT_EQ(directory.exit_code, 2) << directory.output;
  EXPECT_NE(directory.output.find("a directory"), std::string::npos) << directory.output;
}

TEST(SmlaBinaryHostile, ReplayOfHostileCasesExitsTwoWithTheFileAndKey) {
  testkit::DecodeCase batch = testkit::make_decode_case(small_case_options(1));
  const ScopedDir case_dir("cli_hostile");
  ASSERT_TRUE(write_replay_case(case_dir.path(), batch.args()).ok());
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(case_dir / "manifest.json"));
  const auto replay_with = [&](const nlohmann::json& m) {
    std::ofstream(case_dir / "manifest.json", std::ios::trunc) << m.dump();
    return run_smla("replay " + case_dir.path().string() + " --backend reference");
  };

  nlohmann::json huge = manifest;
  huge["extra_page_stride_bytes"] = 9663676416;
  const RunResult stride = replay_with(huge);
  EXPECT_EQ(stride.exit_code, 2) << stride.output;
  EXPECT_NE(stride.output.find("'extra_page_stride_bytes'"), std::string::npos) << stride.output;

  nlohmann::json dir_as_q = manifest;
  std::filesystem::create_directory(case_dir / "q_dir.npy");
  dir_as_q["q"] = "q_dir.npy";
  const RunResult directory = replay_with(dir_as_q);
  EXPECT_EQ(directory.exit_code, 2) << directory.output;
  EXPECT_NE(directory.output.find("q_dir.npy: expected an .npy file, got a directory"), std::string::npos)
      << directory.output;

  std::ofstream(case_dir / "manifest.json", std::ios::trunc) << "{\n  \"op\": \"sparse_decode\",\n  oops\n}";
  const RunResult syntax = run_smla("replay " + case_dir.path().string());
  EXPECT_EQ(syntax.exit_code, 2) << syntax.output;
  EXPECT_NE(syntax.output.find("line 3, column 3"), std::string::npos) << syntax.output;
}

}  // namespace
}  // namespace smla::cli
