// smla::Model in a cuda Context: the whole step on the GPU against the same
// Model on the cpu backend, the whole-step decode graph against eager steps,
// and host-side errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "smla/model.h"
#include "testkit/cuda/device_copy.h"

namespace smla {
namespace {

std::uint64_t test_seed() {
  if (const char* env = std::getenv("SMLA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

ModelConfig tiny_config() {
  auto config = ModelConfig::preset("tiny", 3);  // SWA-only, C4A, C128A
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return *config;
}

std::vector<float> random_rows(std::int64_t tokens, int hidden, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens * hidden));
  for (float& v : x) v = uniform(rng);
  return x;
}

std::int64_t tokens_of(const std::vector<StepEntry>& batch) {
  std::int64_t t = 0;
  for (const auto& e : batch) t += e.query_len;
  return t;
}

TensorView host_view(std::vector<float>& v, std::int64_t tokens, int hidden) {
  return TensorView::contiguous(v.data(), DType::kF32, {tokens, hidden});
}

// (a) Same config, seed and calls on the host Model (kCpu, f32 projections)
// and on the cuda backend, over a prefill-only step, a mixed step and MTP decodes.
//
// Tolerance: both use the same bf16-valued weights, but the device rounds the
// GEMM inputs (x, normalized q_lora) and the output projection's z to bf16
// (relative 2^-9 each) and sums in another order; the FP8 cache quantization
// may then round a few elements the other way. Outputs are RMS-normalized
// (unit RMS), so these perturbations give an RMS difference of order 1e-3 and
// rare element outliers; we allow RMS 3e-2 and max 0.25. Wrong rows,
// positions, caches or a skipped layer give an RMS difference near 1.
// index_topk 128 keeps every C4A row on the short-context selection (all
// entries), since near-equal indexer logits would otherwise rank differently
// on the two paths; the ranking itself is covered by the indexer tests and by
// the graph test below.
TEST(ModelOnCuda, MatchesHostModelOverPrefillMixedAndMtpDecodeSteps) {
  if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (SMLA_TEST_SEED overrides)");
  ModelConfig config = tiny_config();
  config.index_topk = 128;
  ModelOptions options;
  options.max_requests = 3;
  options.max_model_len = 300;
  options.max_batched_tokens = 384;
  options.num_speculative_tokens = 1;
  options.seed = seed;
  options.verify_rows = 8;
  auto host = Model::create(config, options, Backend::kCpu);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  auto device = Model::create(config, options, Backend::kCuda);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  int ids[3];
  for (int& id : ids) {
    auto h = (*host)->add_request();
    auto d = (*device)->add_request();
    ASSERT_TRUE(h.ok() && d.ok());
    ASSERT_EQ(*h, *d);
    id = *h;
  }
  std::vector<std::vector<StepEntry>> steps = {
      {{ids[0], 200}, {ids[1], 140}},                // prefill only
      {{ids[1], 2}, {ids[0], 61}, {ids[2], 37}},     // one MTP decode, then prefill chunks
  };
  for (int i = 0; i < 4; ++i) steps.push_back({{ids[0], 2}, {ids[1], 2}, {ids[2], 2}});
  std::mt19937_64 rng(seed);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const std::int64_t T = tokens_of(steps[s]);
    std::vector<float> x = random_rows(T, config.hidden, rng), want(x.size()), got(x.size(), NAN);
    StepStats host_stats, device_stats;
    ASSERT_TRUE((*host)->step(steps[s], host_view(x, T, config.hidden), host_view(want, T, config.hidden),
                              false, &host_stats)
                    .ok());
    const Status st = (*device)->step(steps[s], host_view(x, T, config.hidden), host_view(got, T, config.hidden),
                                      true, &device_stats);
    ASSERT_TRUE(st.ok()) << st.to_string();
    double sum_sq = 0.0, max_err = 0.0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      const double err = std::fabs(static_cast<double>(got[k]) - want[k]);
      ASSERT_FALSE(std::isnan(err)) << "element " << k;
      sum_sq += err * err;
      max_err = std::max(max_err, err);
    }
    const double rms = std::sqrt(sum_sq / static_cast<double>(want.size()));
    std::cout << "step " << s << " (" << T << " tokens): output vs host rms " << rms << " max " << max_err
              << ", device step " << (*device)->last_timing().step_s * 1e3 << " ms\n";
    EXPECT_LE(rms, 3e-2);
    EXPECT_LE(max_err, 0.25);
    // Attention on the device vs the float64 reference over the same device
    // q and caches: bf16 output rounding only (|o| < 2: 2 ulps = 2e-2).
    ASSERT_EQ(device_stats.checks.size(), config.compress_ratios.size());
    for (const LayerCheck& c : device_stats.checks) {
      EXPECT_LE(c.max_abs_err, 2e-2) << "layer " << c.layer;
      EXPECT_GT(c.rows, 0);
    }
    EXPECT_GT(device_stats.attention_s, 0.0);
    EXPECT_GT((*device)->last_timing().step_s, 0.0);
  }
  for (int id : ids) EXPECT_EQ((*host)->seq_len(id), (*device)->seq_len(id));
  EXPECT_EQ((*host)->kv_cache_bytes_used(), (*device)->kv_cache_bytes_used());
  EXPECT_EQ((*host)->kv_cache_bytes_reserved(), (*device)->kv_cache_bytes_reserved());
}

// (b) Issue 6: one captured decode step (all three layer types, indexer
// ranking active: top-k 16 < entries) replayed with different lengths and
// block tables equals eager steps on an identical second model, bit for bit,
// in outputs and in every cache byte.
TEST(ModelOnCuda, DecodeGraphReplayEqualsEagerStepsBitForBit) {
  if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (SMLA_TEST_SEED overrides)");
  const ModelConfig config = tiny_config();
  ModelOptions options;
  options.max_requests = 3;
  options.max_model_len = 400;
  options.max_batched_tokens = 256;
  options.num_speculative_tokens = 1;
  options.seed = seed;
  auto graphed = Model::create(config, options, Backend::kCuda);
  ASSERT_TRUE(graphed.ok()) << graphed.status().to_string();
  auto eager = Model::create(config, options, Backend::kCuda);
  ASSERT_TRUE(eager.ok()) << eager.status().to_string();
  std::vector<int> ids;
  for (int i = 0; i < 3; ++i) {
    auto a = (*graphed)->add_request();
    auto b = (*eager)->add_request();
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(*a, *b);
    ids.push_back(*a);
  }
  std::mt19937_64 rng(seed ^ 0xC0FFEEu);
  auto both_eager = [&](const std::vector<StepEntry>& batch) {
    const std::int64_t T = tokens_of(batch);
    std::vector<float> x = random_rows(T, config.hidden, rng), out_a(x.size()), out_b(x.size());
    StepStats sa, sb;
    const Status a = (*graphed)->step(batch, host_view(x, T, config.hidden), host_view(out_a, T, config.hidden), false, &sa);
    const Status b = (*eager)->step(batch, host_view(x, T, config.hidden), host_view(out_b, T, config.hidden), false, &sb);
    ASSERT_TRUE(a.ok()) << a.to_string();
    ASSERT_TRUE(b.ok()) << b.to_string();
    ASSERT_EQ(out_a, out_b);
  };
  both_eager({{ids[0], 150}, {ids[1], 90}});
  both_eager({{ids[2], 30}});
  const Status captured = (*graphed)->capture_decode_graph(3);
  ASSERT_TRUE(captured.ok()) << captured.to_string();
  EXPECT_EQ((*graphed)->decode_graph_requests(), 3);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE("replay " + std::to_string(step));
    if (step == 3) {
      // A new request with new pages and state rings: other block tables and lengths.
      ASSERT_TRUE((*graphed)->finish_request(ids[1]).ok());
      ASSERT_TRUE((*eager)->finish_request(ids[1]).ok());
      both_eager({{ids[0], 2}, {ids[2], 2}});
      auto a = (*graphed)->add_request();
      auto b = (*eager)->add_request();
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(*a, *b);
      ids[1] = *a;
      both_eager({{ids[1], 70}});
    }
    // Alternate the batch order so rows map to other requests between replays.
    std::vector<StepEntry> batch = step % 2 == 0
                                       ? std::vector<StepEntry>{{ids[0], 2}, {ids[1], 2}, {ids[2], 2}}
                                       : std::vector<StepEntry>{{ids[2], 2}, {ids[0], 2}, {ids[1], 2}};
    const std::int64_t T = tokens_of(batch);
    std::vector<float> x = random_rows(T, config.hidden, rng), got(x.size(), NAN), want(x.size());
    const Status r = (*graphed)->replay_decode_graph(batch, host_view(x, T, config.hidden), host_view(got, T, config.hidden));
    ASSERT_TRUE(r.ok()) << r.to_string();
    StepStats stats;
    const Status e = (*eager)->step(batch, host_view(x, T, config.hidden), host_view(want, T, config.hidden), false, &stats);
    ASSERT_TRUE(e.ok()) << e.to_string();
    ASSERT_EQ(got, want);
    for (int l = 0; l < static_cast<int>(config.compress_ratios.size()); ++l) {
      const auto bytes_a = (*graphed)->layer_cache_bytes(l);
      ASSERT_FALSE(bytes_a.empty());
      ASSERT_TRUE(bytes_a == (*eager)->layer_cache_bytes(l)) << "layer " << l << " caches differ";
    }
    std::cout << "replay " << step << ": graph " << (*graphed)->last_timing().step_s * 1e3 << " ms, eager "
              << (*eager)->last_timing().step_s * 1e3 << " ms\n";
  }
  for (int id : ids) EXPECT_EQ((*graphed)->seq_len(id), (*eager)->seq_len(id));
}

// (c) Host-side errors come back as Status and change nothing.
TEST(ModelOnCuda, HostSideErrorsAreStatuses) {
  const ModelConfig config = tiny_config();
  ModelOptions options;
  options.max_requests = 2;
  options.max_model_len = 128;
  options.max_batched_tokens = 64;
  if (!cudatest::cuda_device_present()) {
    auto model = Model::create(config, options, Backend::kCuda);
    ASSERT_FALSE(model.ok());
    std::cout << "cuda model without a device: " << model.status().to_string() << "\n";
    GTEST_SKIP() << "no CUDA device (checked: create() reports an error)";
  }
  ModelConfig bad = config;
  bad.o_groups = 3;  // does not divide 4 heads
  auto bad_model = Model::create(bad, options, Backend::kCuda);
  ASSERT_FALSE(bad_model.ok());
  EXPECT_EQ(bad_model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_model.status().message().find("config"), std::string::npos) << bad_model.status().to_string();

  auto model = Model::create(config, options, Backend::kCuda);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  Model& m = **model;
  auto id = m.add_request();
  ASSERT_TRUE(id.ok());
  std::vector<float> x(static_cast<std::size_t>(4 * config.hidden), 0.5f), out(x.size());
  StepStats stats;
  auto expect_error = [&](const Status& s, StatusCode code, const char* names) {
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(names), std::string::npos) << s.to_string();
  };
  const TensorView x4 = host_view(x, 4, config.hidden), out4 = host_view(out, 4, config.hidden);
  expect_error(m.step({{*id, 3}}, x4, out4, false, &stats), StatusCode::kInvalidArgument, "x");
  expect_error(m.step({{*id + 1, 4}}, x4, out4, false, &stats), StatusCode::kInvalidArgument, "request");
  expect_error(m.step({{*id, 2}, {*id, 2}}, x4, out4, false, &stats), StatusCode::kInvalidArgument, "at most once");
  expect_error(m.step({{*id, 0}}, x4, out4, false, &stats), StatusCode::kOutOfRange, "query_len");
  expect_error(m.step({{*id, 200}}, x4, out4, false, &stats), StatusCode::kOutOfRange, "query_len");
  expect_error(m.step({}, x4, out4, false, &stats), StatusCode::kInvalidArgument, "batch");
  expect_error(m.step({{*id, 4}}, x4, out4, false, nullptr), StatusCode::kInvalidArgument, "stats");
  TensorView on_device = out4;
  on_device.device = Device{DeviceKind::kCuda, 0};
  expect_error(m.step({{*id, 4}}, x4, on_device, false, &stats), StatusCode::kInvalidArgument, "out");
  TensorView wrong_width = TensorView::contiguous(x.data(), DType::kF32, {4, config.hidden / 2});
  expect_error(m.step({{*id, 4}}, wrong_width, out4, false, &stats), StatusCode::kInvalidArgument, "x");
  expect_error(m.replay_decode_graph({{*id, 2}}, x4, out4), StatusCode::kInvalidArgument, "graph");
  expect_error(m.capture_decode_graph(0), StatusCode::kOutOfRange, "batch_requests");
  expect_error(m.capture_decode_graph(3), StatusCode::kOutOfRange, "batch_requests");
  expect_error(m.finish_request(7), StatusCode::kInvalidArgument, "request");
  EXPECT_EQ(m.seq_len(*id), 0);  // nothing advanced
  EXPECT_EQ(m.kv_cache_bytes_used(), 0);
  EXPECT_TRUE(m.layer_cache_bytes(-1).empty());

  // A valid step still works after the errors, then the graph rejects a wrong batch.
  const Status ok = m.step({{*id, 4}}, x4, out4, false, &stats);
  ASSERT_TRUE(ok.ok()) << ok.to_string();
  EXPECT_EQ(m.seq_len(*id), 4);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
  const Status captured = m.capture_decode_graph(1);
  ASSERT_TRUE(captured.ok()) << captured.to_string();
  const TensorView x2 = host_view(x, 2, config.hidden), out2 = host_view(out, 2, config.hidden);
  expect_error(m.replay_decode_graph({{*id, 1}}, x2, out2), StatusCode::kInvalidArgument, "query_len");
  expect_error(m.replay_decode_graph({{*id, 2}, {*id, 2}}, x4, out4), StatusCode::kInvalidArgument, "batch");
  EXPECT_EQ(m.seq_len(*id), 4);
}

}  // namespace
}  // namespace smla
