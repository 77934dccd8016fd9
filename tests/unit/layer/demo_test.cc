#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "tools/smla/commands.h"

namespace smla {
namespace {

int run_demo(std::vector<std::string> args) {
  CLI::App app{"smla"};
  int exit_code = -1;
  cli::add_demo_command(app, exit_code);
  args.insert(args.begin(), "demo");
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  app.parse(args);
  return exit_code;
}

TEST(DemoTest, TinyScenarioPassesVerification) {
  EXPECT_EQ(run_demo({"--model", "tiny", "--prompts", "150,70,9", "--chunk", "64", "--decode-steps", "2",
                      "--no-progress"}),
            0);
}

// Prompts whose last chunks are 1-2 tokens (classified as decodes by the metadata).
TEST(DemoTest, ShortPromptsAndShortLastChunks) {
  EXPECT_EQ(run_demo({"--model", "tiny", "--prompts", "66,3,1,2", "--chunk", "64", "--decode-steps", "1",
                      "--no-progress"}),
            0);
}

TEST(DemoTest, ExitsNonZeroPastTolerance) {
  EXPECT_EQ(run_demo({"--model", "tiny", "--prompts", "40", "--decode-steps", "1", "--tolerance", "1e-9",
                      "--no-progress"}),
            1);
}

TEST(DemoTest, RejectsBadOptions) {
  EXPECT_EQ(run_demo({"--model", "v9", "--no-progress"}), 2);
  EXPECT_EQ(run_demo({"--model", "tiny", "--prompts", "12,x", "--no-progress"}), 2);
  EXPECT_EQ(run_demo({"--model", "tiny", "--kv-format", "v32-fp8", "--no-progress"}), 2);
}

}  // namespace
}  // namespace smla
