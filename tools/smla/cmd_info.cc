#include <fmt/core.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/registry.h"
#include "smla/version.h"
#include "tools/smla/commands.h"

namespace smla::cli {

namespace {

// The page sizes the DeepSeek-V4 caches use: 64 (SWA and C4A), 2 (C128A).
constexpr std::int64_t kPageSizes[] = {64, 2};
constexpr Backend kBackends[] = {Backend::kReference, Backend::kCpu, Backend::kCuda};

struct FormatSummary {
  KvFormatInfo info;
  std::vector<std::int64_t> page_bytes;  // one per kPageSizes entry
};

FormatSummary summarize(KvFormat format) {
  FormatSummary summary{kv_format_info(format), {}};
  visit_kv_format(format, [&summary](auto traits) {
    for (std::int64_t page_size : kPageSizes) summary.page_bytes.push_back(decltype(traits)::page_bytes(page_size));
  });
  return summary;
}

std::string join_formats(const std::vector<KvFormat>& formats) {
  if (formats.empty()) return "any";
  std::string text;
  for (KvFormat format : formats) text += (text.empty() ? "" : ",") + std::string(kv_format_name(format));
  return text;
}

std::string join_ints(const std::vector<int>& values) {
  if (values.empty()) return "any";
  std::string text;
  for (int value : values) text += (text.empty() ? "" : ",") + std::to_string(value);
  return text;
}

std::string architectures(const Capabilities& caps) {
  if (caps.min_compute_capability == 0) return "host";
  if (caps.max_compute_capability == caps.min_compute_capability) return fmt::format("sm_{}", caps.min_compute_capability);
  if (caps.max_compute_capability == 0) return fmt::format("sm_{}+", caps.min_compute_capability);
  return fmt::format("sm_{}-{}", caps.min_compute_capability, caps.max_compute_capability);
}

// Whether an implementation can run here at all: its backend has a context on
// this machine and the device is inside its architecture range.
std::string availability(const Implementation& implementation) {
  auto context = Context::create(implementation.backend, TuningOptions{});
  if (!context) return "no " + std::string(backend_name(implementation.backend));
  Problem probe;
  probe.op = implementation.op;
  const std::string reason = unsupported_reason(implementation, *context, probe);
  return reason.empty() ? "yes" : reason;
}

nlohmann::json implementations_json() {
  nlohmann::json rows = nlohmann::json::array();
  for (const Implementation& implementation : implementations()) {
    const Capabilities& caps = implementation.capabilities;
    rows.push_back({{"op", op_name(implementation.op)},
                    {"name", implementation.name},
                    {"backend", backend_name(implementation.backend)},
                    {"priority", implementation.priority},
                    {"formats", join_formats(caps.formats)},
                    {"d_qk", join_ints(caps.d_qk)},
                    {"d_v", join_ints(caps.d_v)},
                    {"max_heads", caps.max_heads},
                    {"architectures", architectures(caps)},
                    {"runs_here", availability(implementation)},
                    {"summary", implementation.summary}});
  }
  return rows;
}

nlohmann::json info_json() {
  nlohmann::json formats = nlohmann::json::array();
  for (KvFormat format : kAllKvFormats) {
    const FormatSummary s = summarize(format);
    nlohmann::json page_bytes = nlohmann::json::object();
    for (std::size_t i = 0; i < s.page_bytes.size(); ++i) page_bytes[std::to_string(kPageSizes[i])] = s.page_bytes[i];
    formats.push_back({{"name", s.info.name},
                       {"head_dim", s.info.head_dim},
                       {"value_dim", s.info.value_dim},
                       {"bytes_per_token", s.info.bytes_per_token},
                       {"storage_dtype", dtype_name(s.info.storage_dtype)},
                       {"row_elements", s.info.row_elements},
                       {"page_bytes", page_bytes}});
  }
  nlohmann::json backends = nlohmann::json::array();
  for (Backend backend : kBackends) {
    backends.push_back({{"name", backend_name(backend)}, {"available", backend_available(backend)}});
  }
  return {{"version", smla::version()},
          {"formats", formats},
          {"backends", backends},
          {"auto_backend", backend_name(resolve_backend(Backend::kAuto))},
          {"implementations", implementations_json()}};
}

void print_info_text() {
  fmt::print("smla {}\n\nKV formats:\n", smla::version());
  fmt::print("  {:<10} {:>8} {:>9} {:>11} {:>13} {:>12} {:>9}\n", "format", "head_dim", "value_dim", "bytes/token",
             "page B @64", "page B @2", "storage");
  for (KvFormat format : kAllKvFormats) {
    const FormatSummary s = summarize(format);
    fmt::print("  {:<10} {:>8} {:>9} {:>11} {:>13} {:>12} {:>9}\n", s.info.name, s.info.head_dim, s.info.value_dim,
               s.info.bytes_per_token, s.page_bytes[0], s.page_bytes[1],
               fmt::format("{}[{}]", dtype_name(s.info.storage_dtype), s.info.row_elements));
  }
  fmt::print("\nBackends:\n");
  for (Backend backend : kBackends) {
    fmt::print("  {:<10} {}\n", backend_name(backend), backend_available(backend) ? "available" : "not available");
  }
  fmt::print("  auto       -> {}\n", backend_name(resolve_backend(Backend::kAuto)));
  fmt::print("\nImplementations (select() takes the highest priority one that fits the call):\n");
  fmt::print("  {:<22} {:<14} {:<9} {:>4} {:<26} {:<8} {:<5} {:<8} {}\n", "op", "name", "backend", "prio", "formats",
             "d_qk", "d_v", "arch", "runs here");
  for (const nlohmann::json& row : implementations_json()) {
    fmt::print("  {:<22} {:<14} {:<9} {:>4} {:<26} {:<8} {:<5} {:<8} {}\n", row["op"].get<std::string>(),
               row["name"].get<std::string>(), row["backend"].get<std::string>(), row["priority"].get<int>(),
               row["formats"].get<std::string>(), row["d_qk"].get<std::string>(), row["d_v"].get<std::string>(),
               row["architectures"].get<std::string>(), row["runs_here"].get<std::string>());
  }
}

}  // namespace

void add_info_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "Print the version, the KV formats with their byte sizes, the backends and every implementation with its capabilities");
  auto as_json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *as_json, "Print the same information as JSON");
  cmd->callback([&exit_code, as_json] {
    if (*as_json) {
      fmt::print("{}\n", info_json().dump(2));
    } else {
      print_info_text();
    }
    exit_code = 0;
  });
}

}  // namespace smla::cli
