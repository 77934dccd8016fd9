// `smla demo`: a DeepSeek-V4-shaped attention stack serving a small scenario
// (several requests, chunked prefill, then MTP decode steps with s_q = 2),
// with timings, throughput, KV-cache memory and a verification of every
// layer's attention against the float64 reference.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "smla/backend.h"
#include "smla/kv_format.h"
#include "smla/model.h"
#include "tools/smla/commands.h"

namespace smla::cli {

namespace {

struct DemoOptions {
  std::string model = "v4-flash";
  int layers = 3;
  std::string backend = "cpu";
  std::string kv_format = "v4-fp8";
  std::string prompts = "192,128,96,64";
  int chunk_tokens = 256;
  int decode_steps = 4;
  int index_topk = 0;  // 0 = the model's
  std::uint64_t seed = 1;
  bool verify = true;
  double tolerance = 2e-2;  // about 2 bf16 ulps of |o| < 2
  bool progress = true;
};

struct RequestProgress {
  int id = -1;
  std::int64_t prompt = 0, prefilled = 0;
  int decodes = 0;
};

Expected<std::vector<std::int64_t>> parse_prompts(const std::string& text) {
  std::vector<std::int64_t> lengths;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      const long long v = std::stoll(item);
      if (v < 1) throw std::invalid_argument("non-positive");
      lengths.push_back(v);
    } catch (const std::exception&) {
      return invalid_argument("--prompts", "comma-separated positive lengths", fmt::format("'{}'", text));
    }
  }
  if (lengths.empty()) return invalid_argument("--prompts", "at least one length", "none");
  return lengths;
}

void print_progress(std::int64_t done, std::int64_t total, int step, double seconds) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  fmt::print(stderr, "\r[{}{}] {:3d}% step {:3d}  {:.1f}s", std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(kWidth - filled), '.'), total > 0 ? 100 * done / total : 100, step,
             seconds);
}

int run_demo(const DemoOptions& opt) {
  using clock = std::chrono::steady_clock;
  auto fail = [](const Status& s) {
    fmt::print(stderr, "smla demo: {}\n", s.to_string());
    return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ? 2 : 1;
  };
  auto backend = parse_backend(opt.backend);
  if (!backend) return fail(backend.status());
  auto format = parse_kv_format(opt.kv_format);
  if (!format) return fail(format.status());
  auto prompts = parse_prompts(opt.prompts);
  if (!prompts) return fail(prompts.status());
  auto config = ModelConfig::preset(opt.model, opt.layers);
  if (!config) return fail(config.status());
  if (opt.index_topk > 0) config->index_topk = opt.index_topk;
  if (opt.chunk_tokens < 2) return fail(invalid_argument("--chunk", "at least 2 tokens", std::to_string(opt.chunk_tokens)));

  ModelOptions model_options;
  model_options.kv_format = *format;
  model_options.max_requests = static_cast<int>(prompts->size());
  std::int64_t longest = 0;
  for (auto p : *prompts) longest = std::max(longest, p);
  model_options.max_model_len = longest + 2 * opt.decode_steps;
  model_options.max_batched_tokens = opt.chunk_tokens;
  model_options.num_speculative_tokens = 1;
  model_options.seed = opt.seed;

  const Backend resolved = resolve_backend(*backend);
  fmt::print("smla demo: model {} ({} layers:", config->name, config->compress_ratios.size());
  for (int r : config->compress_ratios) fmt::print(" {}", layer_type_name(static_cast<LayerType>(r)));
  fmt::print("), hidden {}, {} heads, top-k {}, window {}\n", config->hidden, config->num_heads, config->index_topk,
             config->window);
  fmt::print("  backend {}, kv format {}, {} requests (prompts {}), chunk {} tokens, {} MTP decode steps (s_q = 2)\n",
             backend_name(resolved), kv_format_name(*format), prompts->size(), opt.prompts, opt.chunk_tokens,
             opt.decode_steps);

  const auto t_load = clock::now();
  auto model = Model::create(*config, model_options);
  if (!model) return fail(model.status());
  const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();
  fmt::print("  synthetic weights (seed {}) and caches ready in {:.2f}s\n", opt.seed, load_s);

  std::vector<RequestProgress> requests;
  for (auto p : *prompts) {
    auto id = (*model)->add_request();
    if (!id) return fail(id.status());
    requests.push_back(RequestProgress{*id, p, 0, 0});
  }
  const int hidden = config->hidden;
  std::mt19937_64 rng(opt.seed ^ 0x5EEDu);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);

  std::int64_t total_work = 0;
  for (const auto& r : requests) total_work += r.prompt + 2 * opt.decode_steps;
  std::int64_t done_work = 0, prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  StepStats stats;
  std::map<LayerType, double> max_err;
  std::int64_t verified_rows = 0;
  int step = 0;
  const auto t_start = clock::now();
  while (true) {
    // Decode-first batch (spec 3.1): finished prefills decode 2 tokens (the
    // token and its MTP draft), then prefill chunks fill the token budget.
    std::vector<StepEntry> batch;
    std::int64_t budget = opt.chunk_tokens, step_prefill = 0, step_decode = 0;
    for (auto& r : requests) {
      if (r.prefilled == r.prompt && r.decodes < opt.decode_steps && budget >= 2) {
        batch.push_back({r.id, 2});
        budget -= 2;
        step_decode += 2;
      }
    }
    for (auto& r : requests) {
      if (r.prefilled < r.prompt && budget > 0) {
        const std::int64_t n = std::min(budget, r.prompt - r.prefilled);
        // A 1-2 token chunk would be classified as a decode; keep prefills longer.
        if (n <= 2 && r.prompt - r.prefilled > 2) continue;
        batch.push_back({r.id, static_cast<int>(n)});
        budget -= n;
        step_prefill += n;
      }
    }
    if (batch.empty()) break;
    // Short final prefill chunks (<= 2 tokens) count as decodes: keep them in front.
    std::stable_partition(batch.begin(), batch.end(), [](const StepEntry& e) { return e.query_len <= 2; });
    const std::int64_t T = step_prefill + step_decode;
    std::vector<float> x(static_cast<std::size_t>(T * hidden)), out(x.size());
    for (float& v : x) v = uniform(rng);
    const auto t_step = clock::now();
    Status s = (*model)->step(batch, TensorView::contiguous(x.data(), DType::kF32, {T, hidden}),
                              TensorView::contiguous(out.data(), DType::kF32, {T, hidden}), *backend, opt.verify,
                              &stats);
    if (!s.ok()) {
      if (opt.progress) fmt::print(stderr, "\n");
      return fail(s);
    }
    const double step_s = std::chrono::duration<double>(clock::now() - t_step).count();
    for (const auto& e : batch) {
      for (auto& r : requests) {
        if (r.id != e.request) continue;
        if (r.prefilled < r.prompt) {
          r.prefilled += e.query_len;
        } else {
          ++r.decodes;
        }
      }
    }
    // Attribute the step's time to the phases by token share.
    prefill_s += step_s * static_cast<double>(step_prefill) / static_cast<double>(T);
    decode_s += step_s * static_cast<double>(step_decode) / static_cast<double>(T);
    prefill_tokens += step_prefill;
    decode_tokens += step_decode;
    done_work += T;
    for (const LayerCheck& c : stats.checks) {
      max_err[c.type] = std::max(max_err[c.type], c.max_abs_err);
      verified_rows += c.rows;
    }
    stats.checks.clear();
    ++step;
    if (opt.progress) {
      print_progress(done_work, total_work, step, std::chrono::duration<double>(clock::now() - t_start).count());
    }
  }
  if (opt.progress) fmt::print(stderr, "\n");
  const double total_s = std::chrono::duration<double>(clock::now() - t_start).count();
  const double verify_s = stats.verify_s;
  const double serve_s = total_s - verify_s;

  fmt::print("\n{} steps, {} tokens in {:.2f}s ({:.2f}s serving + {:.2f}s verification)\n", step,
             prefill_tokens + decode_tokens, total_s, serve_s, verify_s);
  fmt::print("  prefill: {:6d} tokens  {:8.1f} tokens/s\n", prefill_tokens,
             prefill_s > 0 ? static_cast<double>(prefill_tokens) / (prefill_s * serve_s / total_s) : 0.0);
  fmt::print("  decode:  {:6d} tokens  {:8.1f} tokens/s ({} requests x {} steps x 2 tokens)\n", decode_tokens,
             decode_s > 0 ? static_cast<double>(decode_tokens) / (decode_s * serve_s / total_s) : 0.0,
             requests.size(), opt.decode_steps);
  fmt::print("  overall: {:8.1f} tokens/s\n", static_cast<double>(prefill_tokens + decode_tokens) / serve_s);
  fmt::print("phases (all layers, all steps):\n");
  for (const auto& [name, seconds] : {std::pair{"projections (BLAS)", stats.projection_s},
                                      std::pair{"q/kv prep + compressors", stats.cache_write_s},
                                      std::pair{"indexer + index transforms", stats.indexer_s},
                                      std::pair{"sparse attention", stats.attention_s},
                                      std::pair{"output projection + residual", stats.output_s},
                                      std::pair{"verification (float64 reference)", verify_s}}) {
    fmt::print("  {:34s} {:8.3f}s\n", name, seconds);
  }
  const double mib = 1024.0 * 1024.0;
  fmt::print("KV cache: {:.2f} MiB used of {:.2f} MiB reserved ({} layers, SWA + compressed + indexer keys)\n",
             static_cast<double>((*model)->kv_cache_bytes_used()) / mib,
             static_cast<double>((*model)->kv_cache_bytes_reserved()) / mib, config->compress_ratios.size());
  if (!opt.verify) {
    fmt::print("verification: skipped (--no-verify)\n");
    return 0;
  }
  bool pass = true;
  fmt::print("verification: {} sampled attention rows vs the float64 reference (tolerance {:g}):\n", verified_rows,
             opt.tolerance);
  for (const auto& [type, err] : max_err) {
    const bool ok = err <= opt.tolerance;
    pass = pass && ok;
    fmt::print("  {:9s} max abs err {:.3e}  {}\n", layer_type_name(type), err, ok ? "ok" : "FAIL");
  }
  fmt::print("{}\n", pass ? "PASS" : "FAIL: attention output beyond tolerance");
  return pass ? 0 : 1;
}

}  // namespace

void add_demo_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<DemoOptions>();
  auto* cmd = app.add_subcommand("demo", "Serve a DeepSeek-V4-shaped attention stack on a synthetic scenario");
  cmd->add_option("--model", opt->model, "v4-flash, v4-pro or tiny")->capture_default_str();
  cmd->add_option("--layers", opt->layers, "layers (0: SWA-only, then C4A/C128A alternating)")->capture_default_str();
  cmd->add_option("--backend", opt->backend, "auto, reference, cpu or cuda")->capture_default_str();
  cmd->add_option("--kv-format", opt->kv_format, "v4-fp8, bf16-rows or fp8-rows")->capture_default_str();
  cmd->add_option("--prompts", opt->prompts, "prompt lengths, comma separated (one request each)")
      ->capture_default_str();
  cmd->add_option("--chunk", opt->chunk_tokens, "token budget per step (chunked prefill)")->capture_default_str();
  cmd->add_option("--decode-steps", opt->decode_steps, "MTP decode steps per request (2 tokens each)")
      ->capture_default_str();
  cmd->add_option("--index-topk", opt->index_topk, "override the indexer top-k (0 = the model's)")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "seed of the synthetic weights and inputs")->capture_default_str();
  cmd->add_option("--tolerance", opt->tolerance, "max abs attention error vs the float64 reference")
      ->capture_default_str();
  cmd->add_flag("!--no-verify", opt->verify, "skip the float64 verification");
  cmd->add_flag("!--no-progress", opt->progress, "no progress bar");
  cmd->callback([opt, &exit_code] { exit_code = run_demo(*opt); });
}

}  // namespace smla::cli
