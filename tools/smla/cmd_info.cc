#include <fmt/core.h>

#include "tools/smla/commands.h"

namespace smla::cli {

void add_info_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "(not yet implemented)");
  cmd->callback([&exit_code] {
    fmt::print(stderr, "smla info: not implemented yet\n");
    exit_code = 2;
  });
}

}  // namespace smla::cli
