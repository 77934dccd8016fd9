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

struct ScenarioBatch {
  std::vector<StepEntry> entries;
  std::int64_t prefill_tokens = 0, decode_tokens = 0;
};

// The next step of the scenario.
ScenarioBatch next_batch(std::vector<RequestProgress>& requests, const DemoOptions& opt) {
  ScenarioBatch next;
  std::vector<StepEntry>& batch = next.entries;
  // Decode-first batch (spec 3.1): finished prefills decode 2 tokens (the
  // token and its MTP draft), then prefill chunks fill the token budget.
  std::int64_t budget = opt.chunk_tokens;
  for (auto& r : requests) {
    if (r.prefilled == r.prompt && r.decodes < opt.decode_steps && budget >= 2) {
      batch.push_back({r.id, 2});
      budget -= 2;
      next.decode_tokens += 2;
    }
  }
  for (auto& r : requests) {
    if (r.prefilled < r.prompt && budget > 0) {
      const std::int64_t n = std::min(budget, r.prompt - r.prefilled);
      // A 1-2 token chunk would be classified as a decode; keep prefills longer.
      if (n <= 2 && r.prompt - r.prefilled > 2) continue;
      batch.push_back({r.id, static_cast<int>(n)});
      budget -= n;
      next.prefill_tokens += n;
    }
  }
  // Short final prefill chunks (<= 2 tokens) count as decodes: keep them in front.
  std::stable_partition(batch.begin(), batch.end(), [](const StepEntry& e) { return e.query_len <= 2; });
  return next;
}

void record_progress(std::vector<RequestProgress>& requests, const std::vector<StepEntry>& batch) {
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
}

void print_progress(std::int64_t done, std::int64_t total, int step, double seconds) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  fmt::print(stderr, "\r[{}{}] {:3d}% step {:3d}  {:.1f}s", std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(kWidth - filled), '.'), total > 0 ? 100 * done / total : 100, step,
             seconds);
}

// Prints the per-layer-type verification; the exit code (1 past tolerance).
int report_verification(const DemoOptions& opt, std::int64_t verified_rows, const std::map<LayerType, double>& max_err) {
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

// Mean of a list of seconds (0 when empty).
double mean_of(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

int fail_with(const Status& s) {
  fmt::print(stderr, "smla demo: {}\n", s.to_string());
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ? 2 : 1;
}

// Random hidden states for the steps, deterministic in the seed.
struct InputSource {
  std::mt19937_64 rng;
  std::uniform_real_distribution<float> uniform{-1.0f, 1.0f};
  int hidden = 0;
  std::vector<float> next(std::int64_t tokens) {
    std::vector<float> x(static_cast<std::size_t>(tokens * hidden));
    for (float& v : x) v = uniform(rng);
    return x;
  }
};

Status run_step(Model& m, const std::vector<StepEntry>& batch, InputSource& inputs, std::int64_t tokens, bool verify,
                StepStats* stats) {
  std::vector<float> x = inputs.next(tokens), out(x.size());
  return m.step(batch, TensorView::contiguous(x.data(), DType::kF32, {tokens, inputs.hidden}),
                TensorView::contiguous(out.data(), DType::kF32, {tokens, inputs.hidden}), verify, stats);
}

struct ScenarioResult {
  int steps = 0;
  std::int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0, decode_s = 0;  // model step time (last_timing), split by token share
  double wall_s = 0;
  StepStats stats;
  std::map<LayerType, double> max_err;
  std::int64_t verified_rows = 0;
};

// The scenario, one step loop for every backend.
Expected<ScenarioResult> run_scenario(Model& m, std::vector<RequestProgress>& requests, InputSource& inputs,
                                      const DemoOptions& opt) {
  using clock = std::chrono::steady_clock;
  ScenarioResult result;
  std::int64_t total_work = 0, done_work = 0;
  for (const auto& r : requests) total_work += r.prompt + 2 * opt.decode_steps;
  const auto t_start = clock::now();
  while (true) {
    const ScenarioBatch next = next_batch(requests, opt);
    if (next.entries.empty()) break;
    const std::int64_t T = next.prefill_tokens + next.decode_tokens;
    if (Status s = run_step(m, next.entries, inputs, T, opt.verify, &result.stats); !s.ok()) {
      if (opt.progress) fmt::print(stderr, "\n");
      return s;
    }
    record_progress(requests, next.entries);
    const double step_s = m.last_timing().step_s;
    result.prefill_s += step_s * static_cast<double>(next.prefill_tokens) / static_cast<double>(T);
    result.decode_s += step_s * static_cast<double>(next.decode_tokens) / static_cast<double>(T);
    result.prefill_tokens += next.prefill_tokens;
    result.decode_tokens += next.decode_tokens;
    done_work += T;
    for (const LayerCheck& c : result.stats.checks) {
      result.max_err[c.type] = std::max(result.max_err[c.type], c.max_abs_err);
      result.verified_rows += c.rows;
    }
    result.stats.checks.clear();
    ++result.steps;
    if (opt.progress) {
      print_progress(done_work, total_work, result.steps, std::chrono::duration<double>(clock::now() - t_start).count());
    }
  }
  if (opt.progress) fmt::print(stderr, "\n");
  result.wall_s = std::chrono::duration<double>(clock::now() - t_start).count();
  return result;
}

void print_phases(const char* title, const StepStats& stats, double divisor, const char* unit) {
  fmt::print("{}\n", title);
  for (const auto& [name, seconds] : {std::pair{"projections (GEMM)", stats.projection_s},
                                      std::pair{"q/kv prep + compressors", stats.cache_write_s},
                                      std::pair{"metadata + indexer + transforms", stats.indexer_s},
                                      std::pair{"sparse attention", stats.attention_s},
                                      std::pair{"output projection + residual", stats.output_s}}) {
    fmt::print("  {:34s} {:8.3f} {}\n", name, seconds / divisor, unit);
  }
}

void print_scenario(const ScenarioResult& r, std::size_t requests, const DemoOptions& opt) {
  auto rate = [](std::int64_t tokens, double s) { return s > 0 ? static_cast<double>(tokens) / s : 0.0; };
  const double step_s = r.prefill_s + r.decode_s;
  fmt::print("\n{} steps, {} tokens in {:.2f}s wall ({:.2f}s of it verification on the host)\n", r.steps,
             r.prefill_tokens + r.decode_tokens, r.wall_s, r.stats.verify_s);
  fmt::print("  prefill: {:6d} tokens  {:8.1f} tokens/s\n", r.prefill_tokens, rate(r.prefill_tokens, r.prefill_s));
  fmt::print("  decode:  {:6d} tokens  {:8.1f} tokens/s ({} requests x {} steps x 2 tokens)\n", r.decode_tokens,
             rate(r.decode_tokens, r.decode_s), requests, opt.decode_steps);
  fmt::print("  overall: {:8.1f} tokens/s (step time: {:.3f}s)\n", rate(r.prefill_tokens + r.decode_tokens, step_s),
             step_s);
  print_phases("phases (all layers, all steps):", r.stats, 1.0, "s");
  fmt::print("  {:34s} {:8.3f} s\n", "verification (float64 reference)", r.stats.verify_s);
}

// Timed decode steps of all requests, eager then replayed from a whole-step
// CUDA graph (backends with graphs only).
Status run_timed_decodes(Model& m, const std::vector<RequestProgress>& requests, InputSource& inputs,
                         const DemoOptions& opt, int steps) {
  using clock = std::chrono::steady_clock;
  const auto R = static_cast<int>(requests.size());
  std::vector<StepEntry> batch;
  for (const auto& r : requests) batch.push_back({r.id, 2});
  const std::int64_t T = 2 * static_cast<std::int64_t>(R);
  if (T > opt.chunk_tokens) {
    fmt::print("decode timing skipped: {} requests x 2 tokens exceed the {} token budget\n", R, opt.chunk_tokens);
    return Status::Ok();
  }
  std::vector<double> eager_s, eager_wall_s, graph_s, graph_wall_s;
  StepStats stats;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = clock::now();
    SMLA_RETURN_IF_ERROR(run_step(m, batch, inputs, T, false, &stats));
    eager_wall_s.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    eager_s.push_back(m.last_timing().step_s);
  }
  SMLA_RETURN_IF_ERROR(m.capture_decode_graph(R));
  for (int i = 0; i < steps; ++i) {
    std::vector<float> x = inputs.next(T), out(x.size());
    const auto t0 = clock::now();
    SMLA_RETURN_IF_ERROR(m.replay_decode_graph(batch, TensorView::contiguous(x.data(), DType::kF32, {T, inputs.hidden}),
                                               TensorView::contiguous(out.data(), DType::kF32, {T, inputs.hidden})));
    graph_wall_s.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    graph_s.push_back(m.last_timing().step_s);
  }
  // The first step of each kind may still warm caches: drop it.
  for (auto* v : {&eager_s, &eager_wall_s, &graph_s, &graph_wall_s}) v->erase(v->begin());
  fmt::print("decode step ({} requests x 2 tokens, mean of {} steps):\n", R, steps - 1);
  fmt::print("  eager:          {:8.3f} ms device  {:8.3f} ms wall  {:9.1f} tokens/s (device)\n", mean_of(eager_s) * 1e3,
             mean_of(eager_wall_s) * 1e3, static_cast<double>(T) / mean_of(eager_s));
  fmt::print("  graph replay:   {:8.3f} ms device  {:8.3f} ms wall  {:9.1f} tokens/s (device)\n", mean_of(graph_s) * 1e3,
             mean_of(graph_wall_s) * 1e3, static_cast<double>(T) / mean_of(graph_s));
  print_phases("phases of the eager decode steps (all layers, device):", stats, steps / 1e3, "ms/step");
  return Status::Ok();
}

// The options checked and turned into the model's configuration.
Expected<std::pair<ModelConfig, ModelOptions>> demo_setup(const DemoOptions& opt, std::vector<std::int64_t>* prompts) {
  auto format = parse_kv_format(opt.kv_format);
  if (!format) return format.status();
  auto parsed = parse_prompts(opt.prompts);
  if (!parsed) return parsed.status();
  *prompts = *parsed;
  auto config = ModelConfig::preset(opt.model, opt.layers);
  if (!config) return config.status();
  if (opt.index_topk > 0) config->index_topk = opt.index_topk;
  if (opt.chunk_tokens < 2) return invalid_argument("--chunk", "at least 2 tokens", std::to_string(opt.chunk_tokens));
  if (opt.decode_steps < 0) return invalid_argument("--decode-steps", ">= 0", std::to_string(opt.decode_steps));
  if (opt.index_topk < 0) return invalid_argument("--index-topk", ">= 0 (0: the model's)", std::to_string(opt.index_topk));
  if (!(std::isfinite(opt.tolerance) && opt.tolerance >= 0)) {
    return invalid_argument("--tolerance", "a finite value >= 0", fmt::format("{}", opt.tolerance));
  }
  ModelOptions model_options;
  model_options.kv_format = *format;
  model_options.max_requests = static_cast<int>(prompts->size());
  std::int64_t longest = 0;
  for (auto p : *prompts) longest = std::max(longest, p);
  model_options.max_model_len = longest + 2 * static_cast<std::int64_t>(opt.decode_steps);
  model_options.max_batched_tokens = opt.chunk_tokens;
  model_options.num_speculative_tokens = 1;
  model_options.seed = opt.seed;
  return std::pair{*config, model_options};
}

int run_demo(const DemoOptions& opt) {
  using clock = std::chrono::steady_clock;
  constexpr int kTimedSteps = 8;  // cuda: extra decode steps of every request, eager and graph-replayed
  auto backend = parse_backend(opt.backend);
  if (!backend) return fail_with(backend.status());
  std::vector<std::int64_t> prompts;
  auto setup = demo_setup(opt, &prompts);
  if (!setup) return fail_with(setup.status());
  auto& [config, model_options] = *setup;
  const Backend resolved = resolve_backend(*backend);
  const bool timed_decodes = resolved == Backend::kCuda;
  if (timed_decodes) model_options.max_model_len += 2 * 2 * kTimedSteps;
  fmt::print("smla demo: model {} ({} layers:", config.name, config.compress_ratios.size());
  for (int r : config.compress_ratios) fmt::print(" {}", layer_type_name(static_cast<LayerType>(r)));
  fmt::print("), hidden {}, {} heads, top-k {}, window {}\n", config.hidden, config.num_heads, config.index_topk,
             config.window);
  fmt::print("  backend {}, kv format {}, {} requests (prompts {}), chunk {} tokens, {} MTP decode steps (s_q = 2)\n",
             backend_name(resolved), kv_format_name(model_options.kv_format), prompts.size(), opt.prompts,
             opt.chunk_tokens, opt.decode_steps);

  const auto t_load = clock::now();
  auto model = Model::create(config, model_options, resolved);
  if (!model) return fail_with(model.status());
  Model& m = **model;
  fmt::print("  synthetic weights (seed {}) and caches ready in {:.2f}s\n", opt.seed,
             std::chrono::duration<double>(clock::now() - t_load).count());
  std::vector<RequestProgress> requests;
  for (auto p : prompts) {
    auto id = m.add_request();
    if (!id) return fail_with(id.status());
    requests.push_back(RequestProgress{*id, p, 0, 0});
  }
  InputSource inputs{.rng = std::mt19937_64(opt.seed ^ 0x5EEDu), .hidden = config.hidden};
  auto result = run_scenario(m, requests, inputs, opt);
  if (!result) return fail_with(result.status());
  print_scenario(*result, requests.size(), opt);
  if (timed_decodes) {
    if (Status s = run_timed_decodes(m, requests, inputs, opt, kTimedSteps); !s.ok()) return fail_with(s);
  }
  const double mib = 1024.0 * 1024.0;
  fmt::print("KV cache: {:.2f} MiB used of {:.2f} MiB reserved in {} memory ({} layers, SWA + compressed + indexer "
             "keys)\n",
             static_cast<double>(m.kv_cache_bytes_used()) / mib, static_cast<double>(m.kv_cache_bytes_reserved()) / mib,
             backend_name(resolved), config.compress_ratios.size());
  return report_verification(opt, result->verified_rows, result->max_err);
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
  cmd->add_option("--seed", opt->seed, "seed of the synthetic weights and inputs")->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--tolerance", opt->tolerance, "max abs attention error vs the float64 reference")
      ->capture_default_str();
  cmd->add_flag("!--no-verify", opt->verify, "skip the float64 verification");
  cmd->add_flag("!--no-progress", opt->progress, "no progress bar");
  cmd->callback([opt, &exit_code] { exit_code = run_guarded("smla demo", [&opt] { return run_demo(*opt); }); });
}

}  // namespace smla::cli
