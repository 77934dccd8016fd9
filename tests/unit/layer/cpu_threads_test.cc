// The kCpu layer ops run tokens on the CPU backend's thread pool: results must
// be the same bytes whatever the thread count, and the optimized indexer must
// select what the float64 reference selects (ties: smaller entry first).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "smla/context.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/model.h"
#include "src/cpu/simd_targets.h"
#include "src/cpu/thread_pool.h"
#include "src/cpu/layer/indexer_score.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using layer_test::Buffer;
using layer_test::OwnedIndexerCache;
using layer_test::OwnedKvCache;
using testing::IsOk;

constexpr int kThreadCounts[] = {1, 2, 3, 5};

// Restores the default thread count however a test ends.
struct ThreadCount {
  explicit ThreadCount(int n) { cpu::set_num_threads(n); }
  ~ThreadCount() { cpu::set_num_threads(0); }
};

// Restores the best SIMD target however a test ends.
struct SimdTarget {
  explicit SimdTarget(std::int64_t id) { cpu::force_simd_target(id); }
  ~SimdTarget() { cpu::force_simd_target(0); }
};

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

// Caches and outputs of a tiny 3-layer model (SWA, C4A with the indexer
// scoring path, C128A) after a chunked prefill of two requests and an MTP
// decode step: every kCpu layer op runs.
struct ModelRun {
  std::vector<std::vector<std::uint8_t>> caches;
  std::vector<float> out;
};

// context_threads: TuningOptions::cpu_threads of the context the model runs in.
ModelRun run_tiny_model(std::uint64_t seed, int context_threads = 0) {
  ModelRun result;
  TuningOptions tuning;
  tuning.cpu_threads = context_threads;
  auto context = Context::create(Backend::kCpu, tuning);
  EXPECT_TRUE(IsOk(context.status()));
  if (!context.ok()) return result;
  auto config = ModelConfig::preset("tiny", 3);
  EXPECT_TRUE(IsOk(config.status()));
  ModelOptions options;
  options.max_requests = 2;
  options.max_model_len = 256;
  options.max_batched_tokens = 200;
  options.seed = seed;
  options.row_stable = true;
  auto model = Model::create(*context, *config, options);
  EXPECT_TRUE(IsOk(model.status()));
  if (!model.ok()) return result;
  Model& m = **model;
  const int hidden = m.config().hidden;
  auto a = m.add_request();
  auto b = m.add_request();
  EXPECT_TRUE(a.ok() && b.ok());
  std::mt19937_64 rng(seed);
  StepStats stats;
  const auto step = [&](const std::vector<StepEntry>& batch, std::int64_t tokens) {
    std::vector<float> x(static_cast<std::size_t>(tokens * hidden)), out(x.size(), layer_test::kNaN);
    layer_test::fill_uniform(x, rng, -1.0f, 1.0f);
    EXPECT_TRUE(IsOk(m.step(batch, TensorView::contiguous(x.data(), DType::kF32, {tokens, hidden}),
                            TensorView::contiguous(out.data(), DType::kF32, {tokens, hidden}), false, &stats)));
    result.out.insert(result.out.end(), out.begin(), out.end());
  };
  step({{*a, 150}, {*b, 40}}, 190);
  step({{*b, 90}}, 90);
  step({{*a, 2}, {*b, 2}}, 4);
  for (int layer = 0; layer < 3; ++layer) result.caches.push_back(m.layer_cache_bytes(layer));
  return result;
}

TEST(CpuLayerThreadsTest, TinyModelIsByteIdenticalForEveryThreadCount) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  ModelRun serial;
  {
    ThreadCount one(1);
    serial = run_tiny_model(seed);
  }
  ASSERT_EQ(serial.caches.size(), 3u);
  for (float v : serial.out) ASSERT_TRUE(std::isfinite(v));
  for (int threads : kThreadCounts) {
    if (threads == 1) continue;
    ThreadCount count(threads);
    const ModelRun parallel = run_tiny_model(seed);
    ASSERT_TRUE(same_bytes(parallel.out, serial.out)) << threads << " threads";
    for (std::size_t layer = 0; layer < 3; ++layer) {
      ASSERT_TRUE(same_bytes(parallel.caches[layer], serial.caches[layer])) << threads << " threads, layer " << layer;
    }
  }
}

// The context's thread count (TuningOptions::cpu_threads) instead of the pool's size: the same bytes.
TEST(CpuLayerThreadsTest, TinyModelIsByteIdenticalForEveryContextThreadCount) {
  ThreadCount restore_afterwards(0);  // limits above the pool's size grow it
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  const ModelRun serial = run_tiny_model(seed, 1);
  ASSERT_EQ(serial.caches.size(), 3u);
  for (int threads : kThreadCounts) {
    if (threads == 1) continue;
    const ModelRun parallel = run_tiny_model(seed, threads);
    ASSERT_TRUE(same_bytes(parallel.out, serial.out)) << threads << " threads";
    for (std::size_t layer = 0; layer < 3; ++layer) {
      ASSERT_TRUE(same_bytes(parallel.caches[layer], serial.caches[layer])) << threads << " threads, layer " << layer;
    }
  }
}

// A limit below the pool's size uses that many workers; one above it grows the pool.
TEST(CpuLayerThreadsTest, ScopedThreadLimitBoundsTheWorkers) {
  ThreadCount pool(4);
  for (int limit : {1, 2, 7}) {
    const cpu::ScopedThreadLimit scope(limit);
    ASSERT_EQ(cpu::num_threads(), limit);
    std::vector<std::atomic<int>> items_by_worker(16);
    cpu::parallel_for(400, [&](std::int64_t, int worker) {
      ASSERT_GE(worker, 0);
      ASSERT_LT(worker, 16);
      items_by_worker[static_cast<std::size_t>(worker)].fetch_add(1);
    });
    int total = 0;
    for (std::size_t w = 0; w < items_by_worker.size(); ++w) {
      if (static_cast<int>(w) >= limit) {
        EXPECT_EQ(items_by_worker[w].load(), 0) << "limit " << limit << " worker " << w;
      }
      total += items_by_worker[w].load();
    }
    EXPECT_EQ(total, 400);
  }
  EXPECT_EQ(cpu::num_threads(), 7) << "the pool grew to the largest limit asked";
  {
    const cpu::ScopedThreadLimit outer(3);
    {
      const cpu::ScopedThreadLimit inner(0);  // 0: the pool's size
      EXPECT_EQ(cpu::num_threads(), 7);
    }
    EXPECT_EQ(cpu::num_threads(), 3);
  }
}

// Tokens sharing a slot: the later token's row stays, as in a serial run.
TEST(CpuLayerThreadsTest, KvPrepSharedSlotsKeepTheLastToken) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::swa_only(), 64);
  ASSERT_TRUE(IsOk(table.status()));
  const int tokens = 7;
  Buffer<float> kv(DType::kF32, {tokens, 512});
  layer_test::fill_uniform(kv.data, rng, -2, 2);
  Buffer<std::int64_t> pos(DType::kI64, {tokens}), slots(DType::kI64, {tokens});
  pos.data = {0, 1, 2, 3, 4, 5, 6};
  slots.data = {2, 4, 2, -1, 4, 2, 0};
  std::vector<std::uint8_t> serial_bytes;
  for (int threads : kThreadCounts) {
    ThreadCount count(threads);
    OwnedKvCache cache(KvFormat::kBf16Rows, 2, 3);
    Buffer<std::uint16_t> rotated(DType::kBF16, {tokens, 512}, 0x7FC0);
    ASSERT_TRUE(IsOk(prepare_kv({kv.view, pos.view, &*table, slots.view, cache.view, rotated.view}, Backend::kCpu)));
    const auto* page = cache.bytes.data();
    const auto row_at = [&](std::int64_t slot) {
      return reinterpret_cast<const std::uint16_t*>(page + (slot / 3) * cache.view.pages.stride[0] * 2) +
             (slot % 3) * 512;
    };
    for (auto [slot, last] : {std::pair{2, 5}, std::pair{4, 4}, std::pair{0, 6}}) {
      for (int i = 0; i < 512; ++i) {
        ASSERT_EQ(row_at(slot)[i], rotated.data[static_cast<std::size_t>(last * 512 + i)]) << slot << " " << threads;
      }
    }
    if (threads == 1) serial_bytes = cache.bytes;
    ASSERT_TRUE(same_bytes(cache.bytes, serial_bytes)) << threads << " threads";
  }
}

// Float64 logits of one token over its causal entries.
std::vector<double> reference_logits(const std::vector<std::vector<float>>& keys, const std::vector<std::uint8_t>& q8,
                                     const std::vector<float>& hw, int heads, int t, std::int64_t entries) {
  std::vector<double> logit(static_cast<std::size_t>(entries), 0.0);
  for (std::int64_t j = 0; j < entries; ++j) {
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int i = 0; i < 128; ++i) {
        dot += static_cast<double>(e4m3_to_f32(q8[static_cast<std::size_t>((t * heads + h) * 128 + i)])) *
               keys[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)];
      }
      logit[static_cast<std::size_t>(j)] += hw[static_cast<std::size_t>(t * heads + h)] * std::max(dot, 0.0);
    }
  }
  return logit;
}

// Two requests with permuted pages of odd size, more entries than one logit
// block, an odd head count and duplicated keys (exact ties).
TEST(CpuLayerThreadsTest, IndexerTopkMatchesTheReferenceSelection) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int heads = 3, tokens = 9, top_k = 24, page = 7, pages_per_request = 24;
  const std::int64_t entries_per_request = page * pages_per_request;  // 168
  OwnedIndexerCache cache(2 * pages_per_request, page);
  Buffer<std::int32_t> table(DType::kI32, {2, pages_per_request});
  const std::vector<std::int32_t> pages = layer_test::permuted_pages(2 * pages_per_request, rng);
  std::copy(pages.begin(), pages.end(), table.data.begin());  // keeps the view's storage
  std::uniform_real_distribution<float> uni(-2, 2);
  std::vector<std::vector<std::vector<float>>> keys(2);  // [request][entry][128] as decoded
  for (int req = 0; req < 2; ++req) {
    keys[static_cast<std::size_t>(req)].assign(static_cast<std::size_t>(entries_per_request), std::vector<float>(128));
    for (std::int64_t j = 0; j < entries_per_request; ++j) {
      const std::int64_t slot = table.data[static_cast<std::size_t>(req * pages_per_request + j / page)] * page + j % page;
      std::uint8_t* base = cache.bytes.data() + (slot / page) * cache.view.pages.stride[0];
      const float scale = 0.25f;
      // Every 5th entry repeats entry j - 3: equal logits on both backends.
      const bool duplicate = j % 5 == 4;
      for (int i = 0; i < 128; ++i) {
        const float value = duplicate ? keys[static_cast<std::size_t>(req)][static_cast<std::size_t>(j - 3)]
                                            [static_cast<std::size_t>(i)] / scale
                                      : uni(rng);
        base[(slot % page) * 128 + i] = f32_to_e4m3(value);
        keys[static_cast<std::size_t>(req)][static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] =
            e4m3_to_f32(base[(slot % page) * 128 + i]) * scale;
      }
      std::memcpy(base + page * 128 + (slot % page) * 4, &scale, 4);
    }
  }
  Buffer<std::uint8_t> q8(DType::kE4M3, {tokens, heads, 128});
  for (auto& c : q8.data) c = f32_to_e4m3(uni(rng));
  Buffer<float> hw(DType::kF32, {tokens, heads});
  layer_test::fill_uniform(hw.data, rng, 0.1f, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {tokens});
  pos.data = {671, 3, 300, 255, 96, 670, 17, 120, 99};
  Buffer<std::int32_t> to_req(DType::kI32, {tokens});
  to_req.data = {0, 0, 1, 0, 1, 1, 0, 0, 1};
  Buffer<std::int32_t> ref(DType::kI32, {tokens, top_k}, 77);
  const IndexerTopkArgs base_args{q8.view, hw.view, cache.view, pos.view, to_req.view, table.view, -1, false, ref.view};
  ASSERT_TRUE(IsOk(indexer_topk(base_args, Backend::kReference)));
  // Every SIMD target the logit pass was compiled for (forced through the CPU
  // backend's Highway dispatch), each with every thread count.
  for (const auto& target : cpu::available_simd_targets()) {
    const SimdTarget forced(target.id);
    SCOPED_TRACE("simd target " + target.name);
    std::vector<std::int32_t> serial;
    for (int threads : kThreadCounts) {
      ThreadCount count(threads);
      Buffer<std::int32_t> top(DType::kI32, {tokens, top_k}, 77);
      IndexerTopkArgs args = base_args;
      args.topk_indices = top.view;
      ASSERT_TRUE(IsOk(indexer_topk(args, Backend::kCpu)));
      if (threads == 1) serial = top.data;
      ASSERT_EQ(top.data, serial) << threads << " threads";
      // Decoding one request's keys at a time gives the same selection.
      Buffer<std::int32_t> one_by_one(DType::kI32, {tokens, top_k}, 77);
      args.topk_indices = one_by_one.view;
      ASSERT_TRUE(IsOk(layer_detail::indexer_topk_f32_batched(args, {tokens, heads, top_k, false}, 1)));
      ASSERT_EQ(one_by_one.data, serial) << threads << " threads, one request per key batch";
      for (int t = 0; t < tokens; ++t) {
        const std::int64_t entries = (pos.data[static_cast<std::size_t>(t)] + 1) / 4;
        const auto logit = reference_logits(keys[static_cast<std::size_t>(to_req.data[static_cast<std::size_t>(t)])],
                                            q8.data, hw.data, heads, t, entries);
        const std::vector<std::int32_t> got(top.data.begin() + t * top_k, top.data.begin() + (t + 1) * top_k);
        const std::vector<std::int32_t> want(ref.data.begin() + t * top_k, ref.data.begin() + (t + 1) * top_k);
        if (got == want) continue;
        // Only near-ties may differ (f32 vs float64 rounding of the logits): each
        // entry only the kCpu backend chose has a logit within rounding of each
        // entry only the reference chose. Exact ties (duplicated keys: equal bits
        // on both backends) must go the same way, to the smaller entry.
        ASSERT_EQ(std::count(got.begin(), got.end(), -1), std::count(want.begin(), want.end(), -1)) << "token " << t;
        for (std::int32_t a : got) {
          if (std::find(want.begin(), want.end(), a) != want.end()) continue;
          for (std::int32_t b : want) {
            if (std::find(got.begin(), got.end(), b) != got.end()) continue;
            const double la = logit[static_cast<std::size_t>(a)], lb = logit[static_cast<std::size_t>(b)];
            ASSERT_NEAR(la, lb, 1e-5 * std::fabs(lb) + 1e-9)
                << "token " << t << ": cpu chose " << a << ", reference " << b;
            ASSERT_NE(la, lb) << "token " << t << ": exact tie of entries " << a << " and " << b
                              << " resolved differently";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace smla
