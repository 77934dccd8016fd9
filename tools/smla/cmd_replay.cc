#include <fmt/core.h>

#include <memory>
#include <string>

#include "tools/smla/commands.h"
#include "tools/smla/replay.h"

namespace smla::cli {

namespace {

struct ReplayCommandOptions {
  std::string case_dir;
  std::string backend = "auto";
  std::string out_dir;    // empty: the case directory
  std::string check_dir;  // empty: no check
};

int run_replay_command(const ReplayCommandOptions& options) {
  auto backend = parse_backend(options.backend);
  if (!backend) {
    fmt::print(stderr, "smla replay: {}\n", backend.status().to_string());
    return 2;
  }
  const std::string out_dir = options.out_dir.empty() ? options.case_dir : options.out_dir;
  auto report = replay_case(options.case_dir, out_dir, *backend);
  if (!report) {
    fmt::print(stderr, "smla replay: {}\n", report.status().to_string());
    return 2;
  }
  fmt::print("{} on backend {} ({:.3f} ms)\n", replay_op_name(report->op), backend_name(report->backend),
             report->seconds * 1e3);
  for (const std::string& line : report->shapes) fmt::print("  {}\n", line);
  for (const auto& path : report->written) fmt::print("wrote {}\n", path.string());
  if (options.check_dir.empty()) return 0;

  auto checks = check_replay_outputs(out_dir, options.check_dir);
  if (!checks) {
    fmt::print(stderr, "smla replay --check: {}\n", checks.status().to_string());
    return 2;
  }
  bool passed = true;
  for (const OutputCheck& check : *checks) {
    fmt::print("check {}: {} {}\n", check.file, check.stats.passed() ? "PASS" : "FAIL", check.stats.to_string());
    passed = passed && check.stats.passed();
  }
  return passed ? 0 : 1;
}

}  // namespace

void add_replay_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("replay", "Run one attention call stored as manifest.json + .npy files (docs/replay.md)");
  auto options = std::make_shared<ReplayCommandOptions>();
  cmd->add_option("dir", options->case_dir, "Directory holding manifest.json and the .npy inputs")->required();
  cmd->add_option("--backend", options->backend, "auto, reference, cpu or cuda")->capture_default_str();
  cmd->add_option("--out", options->out_dir, "Directory for out.npy, lse.npy (and max_logits.npy); default: dir");
  cmd->add_option("--check", options->check_dir,
                  "Directory with reference out.npy (and optionally lse.npy, max_logits.npy): exit 1 when the "
                  "outputs differ beyond the bf16 tolerance");
  cmd->callback([&exit_code, options] {
    exit_code = run_guarded("smla replay", [&options] { return run_replay_command(*options); });
  });
}

}  // namespace smla::cli
