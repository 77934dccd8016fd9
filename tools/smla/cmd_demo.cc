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
#include "smla/cuda_model.h"
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

// `--backend cuda`: the same scenario on CudaModel (every layer on the GPU),
// then timed decode steps of all requests, eager and replayed from a
// whole-step CUDA graph. Step times are device times (cudaEvent) unless
// marked wall.
int run_cuda_demo(const DemoOptions& opt, const ModelConfig& config, ModelOptions model_options,
                  const std::vector<std::int64_t>& prompts) {
  using clock = std::chrono::steady_clock;
  auto fail = [](const Status& s) {
    fmt::print(stderr, "smla demo: {}\n", s.to_string());
    return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ? 2 : 1;
  };
  constexpr int kTimedSteps = 8;  // extra decode steps of every request, eager and graph-replayed
  model_options.max_model_len += 2 * 2 * kTimedSteps;
  const auto t_load = clock::now();
  auto model = CudaModel::create(config, model_options);
  if (!model) {
    fmt::print(stderr, "smla demo: the cuda backend is not usable here: {}\n", model.status().to_string());
    return 1;
  }
  CudaModel& m = **model;
  fmt::print("  synthetic weights (seed {}) and device caches ready in {:.2f}s\n", opt.seed,
             std::chrono::duration<double>(clock::now() - t_load).count());

  std::vector<RequestProgress> requests;
  for (auto p : prompts) {
    auto id = m.add_request();
    if (!id) return fail(id.status());
    requests.push_back(RequestProgress{*id, p, 0, 0});
  }
  const int hidden = config.hidden;
  std::mt19937_64 rng(opt.seed ^ 0x5EEDu);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random_x = [&](std::int64_t tokens) {
    std::vector<float> x(static_cast<std::size_t>(tokens * hidden));
    for (float& v : x) v = uniform(rng);
    return x;
  };

  std::int64_t prefill_tokens = 0, decode_tokens = 0;
  std::vector<double> prefill_step_s, decode_step_s;
  StepStats stats;
  std::map<LayerType, double> max_err;
  std::int64_t verified_rows = 0;
  int step = 0;
  const auto t_start = clock::now();
  while (true) {
    const ScenarioBatch next = next_batch(requests, opt);
    if (next.entries.empty()) break;
    const std::int64_t T = next.prefill_tokens + next.decode_tokens;
    std::vector<float> x = random_x(T), out(x.size());
    Status s = m.step(next.entries, TensorView::contiguous(x.data(), DType::kF32, {T, hidden}),
                      TensorView::contiguous(out.data(), DType::kF32, {T, hidden}), opt.verify, &stats);
    if (!s.ok()) return fail(s);
    record_progress(requests, next.entries);
    if (next.prefill_tokens > 0) {
      prefill_step_s.push_back(m.last_timing().step_s);
    } else {
      decode_step_s.push_back(m.last_timing().step_s);
    }
    prefill_tokens += next.prefill_tokens;
    decode_tokens += next.decode_tokens;
    for (const LayerCheck& c : stats.checks) {
      max_err[c.type] = std::max(max_err[c.type], c.max_abs_err);
      verified_rows += c.rows;
    }
    stats.checks.clear();
    ++step;
  }
  const double scenario_s = std::chrono::duration<double>(clock::now() - t_start).count();
  fmt::print("\n{} steps, {} tokens in {:.2f}s wall ({:.2f}s of it verification on the host)\n", step,
             prefill_tokens + decode_tokens, scenario_s, stats.verify_s);
  double prefill_device_s = 0.0;
  for (double v : prefill_step_s) prefill_device_s += v;
  fmt::print("  prefill: {:6d} tokens in {} steps, {:.3f} ms/step device, {:8.1f} tokens/s (device)\n", prefill_tokens,
             prefill_step_s.size(), mean_of(prefill_step_s) * 1e3,
             prefill_device_s > 0 ? static_cast<double>(prefill_tokens) / prefill_device_s : 0.0);

  double decode_device_s = 0.0;
  for (double v : decode_step_s) decode_device_s += v;
  fmt::print("  decode:  {:6d} tokens in {} steps, {:.3f} ms/step device, {:8.1f} tokens/s (device)\n", decode_tokens,
             decode_step_s.size(), mean_of(decode_step_s) * 1e3,
             decode_device_s > 0 ? static_cast<double>(decode_tokens) / decode_device_s : 0.0);

  // Timed decode steps of all requests: eager (no verification), then the graph.
  const auto R = static_cast<int>(requests.size());
  std::vector<StepEntry> decode_batch;
  for (const auto& r : requests) decode_batch.push_back({r.id, 2});
  const std::int64_t T = 2 * static_cast<std::int64_t>(R);
  if (T <= opt.chunk_tokens) {
    std::vector<double> eager_s, eager_wall_s, graph_s, graph_wall_s;
    StepStats timed_stats;
    for (int i = 0; i < kTimedSteps; ++i) {
      std::vector<float> x = random_x(T), out(x.size());
      const auto t0 = clock::now();
      Status s = m.step(decode_batch, TensorView::contiguous(x.data(), DType::kF32, {T, hidden}),
                        TensorView::contiguous(out.data(), DType::kF32, {T, hidden}), false, &timed_stats);
      if (!s.ok()) return fail(s);
      eager_wall_s.push_back(std::chrono::duration<double>(clock::now() - t0).count());
      eager_s.push_back(m.last_timing().step_s);
    }
    if (Status s = m.capture_decode_graph(R); !s.ok()) return fail(s);
    for (int i = 0; i < kTimedSteps; ++i) {
      std::vector<float> x = random_x(T), out(x.size());
      const auto t0 = clock::now();
      Status s = m.replay_decode_graph(decode_batch, TensorView::contiguous(x.data(), DType::kF32, {T, hidden}),
                                       TensorView::contiguous(out.data(), DType::kF32, {T, hidden}));
      if (!s.ok()) return fail(s);
      graph_wall_s.push_back(std::chrono::duration<double>(clock::now() - t0).count());
      graph_s.push_back(m.last_timing().step_s);
    }
    // The first eager step after the scenario may still warm caches: drop it.
    eager_s.erase(eager_s.begin());
    eager_wall_s.erase(eager_wall_s.begin());
    graph_s.erase(graph_s.begin());
    graph_wall_s.erase(graph_wall_s.begin());
    fmt::print("decode step ({} requests x 2 tokens, mean of {} steps):\n", R, kTimedSteps - 1);
    fmt::print("  eager:          {:8.3f} ms device  {:8.3f} ms wall  {:9.1f} tokens/s (device)\n",
               mean_of(eager_s) * 1e3, mean_of(eager_wall_s) * 1e3, static_cast<double>(T) / mean_of(eager_s));
    fmt::print("  graph replay:   {:8.3f} ms device  {:8.3f} ms wall  {:9.1f} tokens/s (device)\n",
               mean_of(graph_s) * 1e3, mean_of(graph_wall_s) * 1e3, static_cast<double>(T) / mean_of(graph_s));
    fmt::print("phases of the eager decode steps (all layers, device):\n");
    for (const auto& [name, seconds] : {std::pair{"projections (cuBLASLt)", timed_stats.projection_s},
                                        std::pair{"q/kv prep + compressors", timed_stats.cache_write_s},
                                        std::pair{"metadata + indexer + transforms", timed_stats.indexer_s},
                                        std::pair{"sparse attention", timed_stats.attention_s},
                                        std::pair{"output projection + residual", timed_stats.output_s}}) {
      fmt::print("  {:34s} {:8.3f} ms/step\n", name, seconds * 1e3 / kTimedSteps);
    }
  } else {
    fmt::print("decode timing skipped: {} requests x 2 tokens exceed the {} token budget\n", R, opt.chunk_tokens);
  }
  const double mib = 1024.0 * 1024.0;
  fmt::print("KV cache: {:.2f} MiB used of {:.2f} MiB reserved on the device ({} layers, SWA + compressed + indexer keys)\n",
             static_cast<double>(m.kv_cache_bytes_used()) / mib, static_cast<double>(m.kv_cache_bytes_reserved()) / mib,
             config.compress_ratios.size());
  return report_verification(opt, verified_rows, max_err);
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
  if (opt.decode_steps < 0) return fail(invalid_argument("--decode-steps", ">= 0", std::to_string(opt.decode_steps)));
  if (opt.index_topk < 0) return fail(invalid_argument("--index-topk", ">= 0 (0: the model's)", std::to_string(opt.index_topk)));
  if (!(std::isfinite(opt.tolerance) && opt.tolerance >= 0)) {
    return fail(invalid_argument("--tolerance", "a finite value >= 0", fmt::format("{}", opt.tolerance)));
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

  const Backend resolved = resolve_backend(*backend);
  fmt::print("smla demo: model {} ({} layers:", config->name, config->compress_ratios.size());
  for (int r : config->compress_ratios) fmt::print(" {}", layer_type_name(static_cast<LayerType>(r)));
  fmt::print("), hidden {}, {} heads, top-k {}, window {}\n", config->hidden, config->num_heads, config->index_topk,
             config->window);
  fmt::print("  backend {}, kv format {}, {} requests (prompts {}), chunk {} tokens, {} MTP decode steps (s_q = 2)\n",
             backend_name(resolved), kv_format_name(*format), prompts->size(), opt.prompts, opt.chunk_tokens,
             opt.decode_steps);
  if (resolved == Backend::kCuda) return run_cuda_demo(opt, *config, model_options, *prompts);

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
    const ScenarioBatch next = next_batch(requests, opt);
    const std::vector<StepEntry>& batch = next.entries;
    const std::int64_t step_prefill = next.prefill_tokens, step_decode = next.decode_tokens;
    if (batch.empty()) break;
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
    record_progress(requests, batch);
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
  return report_verification(opt, verified_rows, max_err);
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
