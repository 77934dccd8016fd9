// The smla CLI's subcommands. Each add_*_command registers its options and a
// callback; the callback stores the process exit code in `exit_code`
// (0 success, 1 failed check, 2 bad input).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string_view>

namespace smla::cli {

void add_info_command(CLI::App& app, int& exit_code);
void add_attn_command(CLI::App& app, int& exit_code);
void add_replay_command(CLI::App& app, int& exit_code);
void add_plan_command(CLI::App& app, int& exit_code);
void add_demo_command(CLI::App& app, int& exit_code);

// Refuses a leading '-' for unsigned options (CLI11 would wrap "-1" to 2^64 - 1).
CLI::Validator unsigned_integer();

// Runs a command's body and returns its exit code. The last line of defence:
// an exception that escapes the body (std::bad_alloc, ...) is printed as
// "<command>: ..." on stderr and gives exit code 2. Input is checked before
// anything is allocated, so reaching this is a bug worth reporting.
int run_guarded(std::string_view command, const std::function<int()>& body);

}  // namespace smla::cli
