#include <CLI/CLI.hpp>

#include "tools/smla/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"smla: DeepSeek-V4 sparse MLA attention (CPU reference, CPU SIMD and CUDA backends)"};
  app.require_subcommand(1);
  int exit_code = 0;
  smla::cli::add_info_command(app, exit_code);
  smla::cli::add_attn_command(app, exit_code);
  smla::cli::add_replay_command(app, exit_code);
  smla::cli::add_plan_command(app, exit_code);
  smla::cli::add_demo_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
