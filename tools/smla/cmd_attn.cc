// smla attn: one random DeepSeek-V4-shaped decode batch through a backend,
// checked against the reference backend and timed.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "smla/attention.h"
#include "smla/backend.h"
#include "testkit/testkit.h"
#include "tools/smla/check.h"
#include "tools/smla/commands.h"
#include "tools/smla/input_files.h"
#include "tools/smla/run_op.h"

namespace smla::cli {

namespace {

struct AttnCommandOptions {
  testkit::DecodeCaseOptions decode;
  std::string format = "v4-fp8";
  std::string backend = "auto";
  int repeat = 5;
  bool extra_topk_given = false;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

int fail_input(const Status& status) {
  fmt::print(stderr, "smla attn: {}\n", status.to_string());
  return 2;
}

// check_decode_case_options names DecodeCaseOptions fields; the user typed options.
Status in_option_names(const Status& status) {
  static constexpr std::pair<std::string_view, std::string_view> kOptionOf[] = {
      {"num_requests", "--requests"},      {"s_q", "--tokens"},           {"num_heads", "--heads"},
      {"main_topk", "--window"},           {"main_page_size", "--page-size"}, {"main_context", "--context"},
      {"extra_topk", "--extra-topk"},      {"extra_page_size", "--extra-page-size"},
      {"extra_context", "--extra-context"}};
  for (const auto& [field, option] : kOptionOf) {
    const std::string prefix = fmt::format("{}: ", field);
    if (status.message().rfind(prefix, 0) == 0) {
      return Status(status.code(), fmt::format("{}: {}", option, status.message().substr(prefix.size())));
    }
  }
  return status;
}

// An upper bound of the host bytes the batch takes (testkit::make_decode_case,
// the outputs and the reference's outputs), per group of options, so that a
// batch too large for the machine is refused before anything is allocated.
Status check_batch_size(const testkit::DecodeCaseOptions& o) {
  using Real = long double;
  const KvFormatInfo info = kv_format_info(o.format);
  const Real tokens = static_cast<Real>(o.num_requests) * static_cast<Real>(o.s_q);
  const auto cache_bytes = [&](std::int64_t context, std::int64_t page_size, std::int64_t topk) {
    const Real pages = static_cast<Real>(o.num_requests) * std::ceil(static_cast<Real>(context) / page_size) + 2;
    const Real slots = pages * static_cast<Real>(page_size);
    // Pages (plus padding), one bit per slot, and the float rows written for the attended slots.
    return slots * (info.bytes_per_token + 1) + pages * 64 +
           std::min(slots, tokens * static_cast<Real>(topk)) * info.head_dim * 4;
  };
  // Per index entry: the i32 index, its logical position (i64) and bookkeeping.
  constexpr Real kIndexEntryBytes = 24;
  struct Term {
    const char* options;
    Real bytes;
  };
  const Term terms[] = {
      {"--requests, --tokens, --heads",
       tokens * static_cast<Real>(o.num_heads) * (info.head_dim * 2 + info.value_dim * 4 + 16)},
      {"--page-size, --context, --requests", cache_bytes(o.main_context, o.main_page_size, o.main_topk)},
      {"--window", tokens * static_cast<Real>(o.main_topk) * kIndexEntryBytes},
      {"--extra-page-size, --extra-context, --requests",
       o.extra_topk > 0 ? cache_bytes(o.extra_context, o.extra_page_size, o.extra_topk) : 0},
      {"--extra-topk", tokens * static_cast<Real>(o.extra_topk) * kIndexEntryBytes},
  };
  Real total = 0;
  const Term* largest = &terms[0];
  for (const Term& term : terms) {
    total += term.bytes;
    if (term.bytes > largest->bytes) largest = &term;
  }
  return check_allocation(largest->options, "a batch (q, caches, indices, outputs) whose host memory stays", total);
}

int run_attn_command(AttnCommandOptions options) {
  auto format = parse_kv_format(options.format);
  if (!format) return fail_input(format.status());
  auto requested = parse_backend(options.backend);
  if (!requested) return fail_input(requested.status());
  if (options.repeat < 1) return fail_input(invalid_argument("--repeat", ">= 1", fmt::format("{}", options.repeat)));
  options.decode.format = *format;
  // V3.2 layers have no compressed cache: drop the default extra top-k rather than fail.
  if (*format == KvFormat::kV32Fp8 && !options.extra_topk_given) options.decode.extra_topk = 0;
  if (Status status = testkit::check_decode_case_options(options.decode); !status.ok()) {
    return fail_input(in_option_names(status));
  }
  if (Status status = check_batch_size(options.decode); !status.ok()) return fail_input(status);
  const Backend backend = resolve_backend(*requested);
  if (!backend_available(backend)) {
    return fail_input(unimplemented(fmt::format("backend '{}' is not available in this build or on this machine",
                                                backend_name(backend))));
  }

  testkit::DecodeCase batch = testkit::make_decode_case(options.decode);
  const SparseDecodeArgs args = batch.args();
  fmt::print("sparse_decode {} on backend {}, seed {}\n", options.format, backend_name(backend), options.decode.seed);
  fmt::print("  q {}  main cache {}  main indices {}\n", args.q.shape_string(), args.main_cache.pages.shape_string(),
             args.main_indices.shape_string());
  if (args.extra_cache) {
    fmt::print("  extra cache {}  extra indices {}\n", args.extra_cache->pages.shape_string(),
               args.extra_indices.shape_string());
  }
  fmt::print("  out {}  lse {}  softmax_scale {:.6g}  attended entries {}\n", args.out.shape_string(),
             args.lse.shape_string(), args.softmax_scale, batch.attended_entries());

  std::vector<double> seconds;
  if (Status status = run_sparse_decode(args, backend, options.repeat, &seconds); !status.ok()) {
    return fail_input(status);
  }

  testkit::HostTensor want_out = batch.make_out();
  testkit::HostTensor want_lse = batch.make_lse();
  if (Status status = sparse_decode(batch.args_with_outputs(want_out.view(), want_lse.view()), Backend::kReference);
      !status.ok()) {
    return fail_input(status.with_context("reference: "));
  }
  const testkit::ErrorStats out_stats = check_bf16_output(args.out, want_out.view());
  const testkit::ErrorStats lse_stats = check_f32_output(args.lse, want_lse.view());

  const double time = median(seconds);
  const double flop = 2.0 * static_cast<double>(batch.num_heads()) * static_cast<double>(batch.attended_entries()) *
                      static_cast<double>(batch.d_qk() + batch.d_v());
  fmt::print("out vs reference: {} {}\n", out_stats.passed() ? "PASS" : "FAIL", out_stats.to_string());
  fmt::print("lse vs reference: {} {}\n", lse_stats.passed() ? "PASS" : "FAIL", lse_stats.to_string());
  fmt::print("time per call (median of {}): {:.3f} ms, {:.0f} tokens/s, {:.2f} GFLOP/s\n", options.repeat, time * 1e3,
             static_cast<double>(batch.num_tokens()) / time, flop / time * 1e-9);
  return out_stats.passed() && lse_stats.passed() ? 0 : 1;
}

}  // namespace

void add_attn_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("attn", "Run a random DeepSeek-V4 decode batch on a backend, check it against the "
                                         "reference and time it (exit 1 when the error exceeds the bf16 tolerance)");
  auto options = std::make_shared<AttnCommandOptions>();
  testkit::DecodeCaseOptions& d = options->decode;
  d.seed = 1;
  cmd->add_option("--tokens", d.s_q, "Query tokens per request (s_q; 2 = one MTP draft token)")->capture_default_str();
  cmd->add_option("--requests", d.num_requests, "Requests in the batch")->capture_default_str();
  cmd->add_option("--heads", d.num_heads, "Query heads h_q (1..128)")->capture_default_str();
  cmd->add_option("--window", d.main_topk, "Main (sliding-window) top-k per token")->capture_default_str();
  cmd->add_option("--extra-topk", d.extra_topk, "Compressed-cache top-k per token; 0 = SWA-only (no extra cache)")
      ->capture_default_str();
  cmd->add_option("--page-size", d.main_page_size, "Main cache page size in tokens")->capture_default_str();
  cmd->add_option("--extra-page-size", d.extra_page_size, "Extra cache page size in entries (64 C4A, 2 C128A)")
      ->capture_default_str();
  cmd->add_option("--context", d.main_context, "Tokens each request holds in the main cache")->capture_default_str();
  cmd->add_option("--extra-context", d.extra_context, "Entries each request holds in the extra cache")
      ->capture_default_str();
  cmd->add_option("--format", options->format, "KV format: v4-fp8, v32-fp8, bf16-rows or fp8-rows")
      ->capture_default_str();
  cmd->add_flag("--random-lengths", d.random_lengths, "Per-token lengths uniform in [0, width]");
  cmd->add_option("--seed", d.seed, "Random seed of the batch")->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--backend", options->backend, "auto, reference, cpu or cuda")->capture_default_str();
  cmd->add_option("--repeat", options->repeat, "Timed calls; the median is reported")->capture_default_str();
  cmd->callback([&exit_code, options, cmd] {
    AttnCommandOptions run = *options;
    run.extra_topk_given = cmd->count("--extra-topk") > 0;
    exit_code = run_guarded("smla attn", [&run] { return run_attn_command(std::move(run)); });
  });
}

}  // namespace smla::cli
