// The smla CLI's subcommands. Each add_*_command registers its options and a
// callback; the callback stores the process exit code in `exit_code`
// (0 success, 1 failed check, 2 bad input).
#pragma once

#include <CLI/CLI.hpp>

namespace smla::cli {

void add_info_command(CLI::App& app, int& exit_code);
void add_attn_command(CLI::App& app, int& exit_code);
void add_replay_command(CLI::App& app, int& exit_code);
void add_plan_command(CLI::App& app, int& exit_code);
void add_demo_command(CLI::App& app, int& exit_code);

}  // namespace smla::cli
