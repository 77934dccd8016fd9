#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <exception>
#include <new>

#include "tools/smla/commands.h"
#include "tools/smla/input_files.h"

int main(int argc, char** argv) {
  // Every command checks its input and catches what escapes its body
  // (run_guarded); this catch is for whatever is left, e.g. CLI11 itself.
  try {
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
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "smla: out of host memory\n");
  } catch (const std::exception& e) {
    fmt::print(stderr, "smla: internal error: {}\n", smla::cli::printable(e.what()));
  } catch (...) {
    fmt::print(stderr, "smla: internal error: unknown exception\n");
  }
  return 2;
}
