#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "smla/model.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using testing::FailsWith;
using testing::IsOk;

ModelOptions tiny_options(std::uint64_t seed) {
  ModelOptions o;
  o.max_requests = 3;
  o.max_model_len = 256;
  o.max_batched_tokens = 160;
  o.seed = seed;
  o.row_stable = true;  // bit-identical projections however tokens are batched
  return o;
}

std::unique_ptr<Model> tiny_model(std::uint64_t seed, Backend backend = Backend::kCpu) {
  auto config = ModelConfig::preset("tiny", 3);
  EXPECT_TRUE(IsOk(config.status()));
  auto model = Model::create(*config, tiny_options(seed), backend);
  EXPECT_TRUE(IsOk(model.status()));
  return model ? std::move(*model) : nullptr;
}

// Hidden states of a whole prompt, deterministic in the seed.
std::vector<float> prompt(std::int64_t tokens, int hidden, std::uint64_t seed) {
  std::vector<float> x(static_cast<std::size_t>(tokens * hidden));
  std::mt19937_64 rng(seed);
  layer_test::fill_uniform(x, rng, -1.0f, 1.0f);
  return x;
}

Status run(Model& model, int request, std::vector<float>& x, std::int64_t begin, std::int64_t end, bool verify,
           StepStats* stats) {
  const int hidden = model.config().hidden;
  std::vector<float> out(static_cast<std::size_t>((end - begin) * hidden));
  return model.step({{request, static_cast<int>(end - begin)}},
                    TensorView::contiguous(x.data() + begin * hidden, DType::kF32, {end - begin, hidden}),
                    TensorView::contiguous(out.data(), DType::kF32, {end - begin, hidden}), verify, stats);
}

// 140 tokens: windows of 32 slide, the indexer selects 16 of up to 35 entries,
// and one C128A entry closes at position 127.
constexpr std::int64_t kPromptLen = 140;

TEST(ModelTest, ChunkedPrefillLeavesTheCachesOfOneWholePrefill) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  auto whole = tiny_model(seed);
  ASSERT_NE(whole, nullptr);
  auto x = prompt(kPromptLen, whole->config().hidden, seed);
  auto request = whole->add_request();
  ASSERT_TRUE(IsOk(request.status()));
  StepStats stats;
  ASSERT_TRUE(IsOk(run(*whole, *request, x, 0, kPromptLen, false, &stats)));
  // Every boundary the caches care about: window (32), C4 entries (4), the
  // indexer shortcut threshold (68 = 4 * (16 + 1)), pages (64) and the C128
  // entry (128). The op tests split at every point (compressor_test.cc).
  for (std::int64_t split : {1, 2, 3, 4, 5, 31, 32, 33, 37, 63, 64, 65, 67, 68, 69, 127, 128, 129, 139}) {
    auto chunked = tiny_model(seed);
    auto id = chunked->add_request();
    ASSERT_TRUE(IsOk(id.status()));
    ASSERT_TRUE(IsOk(run(*chunked, *id, x, 0, split, false, &stats)));
    ASSERT_TRUE(IsOk(run(*chunked, *id, x, split, kPromptLen, false, &stats)));
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_EQ(chunked->layer_cache_bytes(layer), whole->layer_cache_bytes(layer))
          << "layer " << layer << ", split at " << split;
    }
  }
}

TEST(ModelTest, MtpDecodeStepsAgreeWithTheReference) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  auto model = tiny_model(seed);
  ASSERT_NE(model, nullptr);
  const int hidden = model->config().hidden;
  auto a = model->add_request();
  auto b = model->add_request();
  ASSERT_TRUE(a.ok() && b.ok());
  auto xa = prompt(kPromptLen, hidden, seed + 1);
  auto xb = prompt(50, hidden, seed + 2);
  StepStats stats;
  ASSERT_TRUE(IsOk(run(*model, *a, xa, 0, kPromptLen, true, &stats)));
  ASSERT_TRUE(IsOk(run(*model, *b, xb, 0, 50, true, &stats)));
  for (int step = 0; step < 3; ++step) {
    // Two decode requests, each with one MTP draft token (s_q = 2).
    auto x = prompt(4, hidden, seed + 10 + static_cast<std::uint64_t>(step));
    std::vector<float> out(static_cast<std::size_t>(4 * hidden), layer_test::kNaN);
    ASSERT_TRUE(IsOk(model->step({{*a, 2}, {*b, 2}}, TensorView::contiguous(x.data(), DType::kF32, {4, hidden}),
                                 TensorView::contiguous(out.data(), DType::kF32, {4, hidden}), true,
                                 &stats)));
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(model->seq_len(*a), kPromptLen + 6);
  EXPECT_EQ(model->seq_len(*b), 50 + 6);
  ASSERT_EQ(stats.checks.size(), 5u * 3u);
  for (const LayerCheck& check : stats.checks) {
    EXPECT_LT(check.max_abs_err, 1.5e-2) << "layer " << check.layer << " " << layer_type_name(check.type);
    EXPECT_GT(check.rows, 0);
  }
  EXPECT_GT(model->kv_cache_bytes_used(), 0);
  EXPECT_LE(model->kv_cache_bytes_used(), model->kv_cache_bytes_reserved());
  EXPECT_TRUE(IsOk(model->finish_request(*a)));
  EXPECT_EQ(model->seq_len(*a), -1);
}

// The whole stack on the float64 reference backend against the f32 CPU backend.
// 60 tokens keep the C4A layer on the short-context path (15 entries <= 16), so
// both backends attend the same entries; the ops tests compare the indexer.
TEST(ModelTest, ReferenceAndCpuBackendsAgree) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  auto cpu = tiny_model(seed, Backend::kCpu);
  auto ref = tiny_model(seed, Backend::kReference);
  ASSERT_TRUE(cpu && ref);
  const int hidden = cpu->config().hidden;
  auto x = prompt(60, hidden, seed + 3);
  std::vector<float> out_cpu(x.size(), layer_test::kNaN), out_ref(x.size(), layer_test::kNaN);
  StepStats stats;
  EXPECT_EQ(cpu->backend(), Backend::kCpu);
  EXPECT_EQ(ref->backend(), Backend::kReference);
  for (auto [model, out] : {std::pair{cpu.get(), &out_cpu}, std::pair{ref.get(), &out_ref}}) {
    auto id = model->add_request();
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(IsOk(model->step({{*id, 60}}, TensorView::contiguous(x.data(), DType::kF32, {60, hidden}),
                                 TensorView::contiguous(out->data(), DType::kF32, {60, hidden}), false, &stats)));
    EXPECT_GT(model->last_timing().step_s, 0.0);
  }
  double max_err = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) max_err = std::max(max_err, std::fabs(double{out_cpu[i]} - out_ref[i]));
  EXPECT_LT(max_err, 0.05);  // normalized hidden states; bf16 roundings of q, kv and o differ by an ulp at most

  // Both models hold the same pages, so their caches line up byte for byte in size.
  for (int l = 0; l < 3; ++l) EXPECT_EQ(cpu->layer_cache_bytes(l).size(), ref->layer_cache_bytes(l).size());
}

TEST(ModelTest, DecodeGraphsAreUnimplementedOnHostBackends) {
  auto model = tiny_model(7);
  ASSERT_NE(model, nullptr);
  auto id = model->add_request();
  ASSERT_TRUE(id.ok());
  const int hidden = model->config().hidden;
  std::vector<float> x(static_cast<std::size_t>(2 * hidden)), out(x.size());
  EXPECT_TRUE(FailsWith(model->capture_decode_graph(1), StatusCode::kUnimplemented, {"cuda", "cpu"}));
  EXPECT_TRUE(FailsWith(model->replay_decode_graph({{*id, 2}}, TensorView::contiguous(x.data(), DType::kF32, {2, hidden}),
                                                   TensorView::contiguous(out.data(), DType::kF32, {2, hidden})),
                        StatusCode::kUnimplemented, {"cuda", "cpu"}));
  EXPECT_EQ(model->decode_graph_requests(), 0);
  EXPECT_EQ(model->seq_len(*id), 0);
}

TEST(ModelTest, RejectsBadBatches) {
  auto model = tiny_model(5);
  ASSERT_NE(model, nullptr);
  auto id = model->add_request();
  ASSERT_TRUE(id.ok());
  const int hidden = model->config().hidden;
  std::vector<float> x(static_cast<std::size_t>(2 * hidden)), out(x.size());
  auto xv = TensorView::contiguous(x.data(), DType::kF32, {2, hidden});
  auto ov = TensorView::contiguous(out.data(), DType::kF32, {2, hidden});
  StepStats stats;
  EXPECT_TRUE(FailsWith(model->step({{7, 2}}, xv, ov, false, &stats), StatusCode::kInvalidArgument,
                        {"batch[0].request"}));
  EXPECT_TRUE(FailsWith(model->step({{*id, 3}}, xv, ov, false, &stats), StatusCode::kInvalidArgument,
                        {"x", "[3, 256]"}));
  EXPECT_TRUE(FailsWith(model->step({{*id, 300}}, xv, ov, false, &stats), StatusCode::kOutOfRange,
                        {"query_len"}));
  EXPECT_EQ(model->seq_len(*id), 0);
  EXPECT_FALSE(ModelConfig::preset("v5", 3).ok());
}

}  // namespace
}  // namespace smla
