#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "smla/indexer.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using layer_test::Buffer;
using layer_test::OwnedIndexerCache;
using testing::FailsWith;
using testing::IsOk;

TEST(IndexerQueryTest, HandQuantizationFoldsTheScaleIntoTheWeights) {
  auto table = RopeTable::create(RopeConfig::compressed(), 4);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> q(DType::kF32, {1, 2, 128}, 0.0f);
  std::fill_n(q.data.begin(), 128, 1.0f);  // head 0: amax 1 -> scale 2^-8; head 1: zeros -> 2^-22
  Buffer<float> w(DType::kF32, {1, 2});
  w.data = {3.0f, 5.0f};
  Buffer<std::int64_t> pos(DType::kI64, {1}, 0);
  for (Backend backend : layer_test::host_backends(Op::kPrepareIndexerQuery)) {
    Buffer<std::uint8_t> q8(DType::kE4M3, {1, 2, 128}, 0x7F);
    Buffer<float> hw(DType::kF32, {1, 2}, layer_test::kNaN);
    ASSERT_TRUE(IsOk(prepare_indexer_query({q.view, w.view, pos.view, &*table, q8.view, hw.view}, backend)));
    for (int i = 0; i < 128; ++i) ASSERT_EQ(e4m3_to_f32(q8.data[static_cast<std::size_t>(i)]), 256.0f) << i;
    for (int i = 128; i < 256; ++i) ASSERT_EQ(q8.data[static_cast<std::size_t>(i)], 0) << i;
    const double softmax_and_head_scale = 1.0 / std::sqrt(128.0) / std::sqrt(2.0);
    EXPECT_NEAR(hw.data[0], 3.0 * std::ldexp(1.0, -8) * softmax_and_head_scale, 1e-9);
    EXPECT_NEAR(hw.data[1], 5.0 * std::ldexp(1.0, -22) * softmax_and_head_scale, 1e-12);
  }
}

// One key per entry: value v_j in dim 0, scale 1. q = e_0, weight 1 -> logit_j = ReLU(v_j).
struct HandKeys {
  OwnedIndexerCache cache{3, 3};
  Buffer<std::int32_t> table{DType::kI32, {1, 3}};
  HandKeys(const std::vector<float>& values) {
    table.data = {2, 0, 1};
    for (std::size_t j = 0; j < values.size(); ++j) {
      const std::int64_t slot = table.data[j / 3] * 3 + static_cast<std::int64_t>(j % 3);
      std::uint8_t* page = cache.bytes.data() + (slot / 3) * cache.view.pages.stride[0];
      std::uint8_t* codes = page + (slot % 3) * 128;
      std::memset(codes, 0, 128);
      codes[0] = f32_to_e4m3(values[j]);
      const float one = 1.0f;
      std::memcpy(page + 3 * 128 + (slot % 3) * 4, &one, 4);
    }
  }
};

TEST(IndexerTopkTest, HandLogitsTiesAndCausalLimit) {
  HandKeys keys({0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 1.0f, 2.0f});
  Buffer<std::uint8_t> q8(DType::kE4M3, {3, 1, 128}, 0);
  for (int t = 0; t < 3; ++t) q8.data[static_cast<std::size_t>(t * 128)] = f32_to_e4m3(1.0f);
  Buffer<float> hw(DType::kF32, {3, 1}, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {3});
  pos.data = {27, 10, 2};  // 7, 2 and 0 valid entries
  Buffer<std::int32_t> to_req(DType::kI32, {3}, 0);
  for (Backend backend : layer_test::host_backends(Op::kIndexerTopk)) {
    // Logits 0.5, 2, 2, 0, 3, 1, 2: k = 3 takes entry 4 and two of the tied
    // entries 1, 2, 6 (the smaller numbers), written in ascending order.
    Buffer<std::int32_t> top3(DType::kI32, {3, 3}, 77), top10(DType::kI32, {3, 10}, 77);
    IndexerTopkArgs args{q8.view, hw.view, keys.cache.view, pos.view, to_req.view, keys.table.view, -1, false, top3.view};
    ASSERT_TRUE(IsOk(indexer_topk(args, backend)));
    EXPECT_EQ(top3.data, (std::vector<std::int32_t>{1, 2, 4, 0, 1, -1, -1, -1, -1}));
    args.topk_indices = top10.view;
    ASSERT_TRUE(IsOk(indexer_topk(args, backend)));
    EXPECT_EQ(std::vector<std::int32_t>(top10.data.begin(), top10.data.begin() + 10),
              (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, -1, -1, -1}));
  }
}

TEST(IndexerTopkTest, ShortContextShortcutFillsAscendingEntries) {
  Buffer<std::uint8_t> q8(DType::kE4M3, {2, 1, 128}, 0);
  Buffer<float> hw(DType::kF32, {2, 1}, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {2});
  pos.data = {9, 3};
  Buffer<std::int32_t> to_req(DType::kI32, {2}, 0), top(DType::kI32, {2, 4}, 77);
  // max_seq_len 16 -> 16 / 4 <= 4: the shortcut needs no key cache at all.
  IndexerTopkArgs args{q8.view, hw.view, {}, pos.view, to_req.view, {}, 16, true, top.view};
  ASSERT_TRUE(IsOk(indexer_topk(args)));
  EXPECT_EQ(top.data, (std::vector<std::int32_t>{0, 1, -1, -1, 0, -1, -1, -1}));
  args.max_seq_len = 20;  // 20 / 4 > 4: the key cache is required
  EXPECT_TRUE(FailsWith(indexer_topk(args), StatusCode::kInvalidArgument, {"key_cache"}));
}

// Random keys: both backends must return, in ascending entry order, a top-k
// whose logits (recomputed here in double) dominate every entry left out.
TEST(IndexerTopkTest, BackendsSelectTheLargestLogits) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int heads = 4, tokens = 5, top_k = 6, page = 5, pages = 4;
  OwnedIndexerCache cache(pages, page);
  Buffer<std::int32_t> table(DType::kI32, {1, pages});
  table.data = {3, 1, 0, 2};
  std::uniform_real_distribution<float> uni(-2, 2);
  std::vector<std::vector<float>> keys(pages * page, std::vector<float>(128));
  for (std::int64_t j = 0; j < pages * page; ++j) {
    const std::int64_t slot = table.data[static_cast<std::size_t>(j / page)] * page + j % page;
    std::uint8_t* base = cache.bytes.data() + (slot / page) * cache.view.pages.stride[0];
    const float scale = 0.25f;
    for (int i = 0; i < 128; ++i) {
      base[(slot % page) * 128 + i] = f32_to_e4m3(uni(rng));
      keys[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = e4m3_to_f32(base[(slot % page) * 128 + i]) * scale;
    }
    std::memcpy(base + page * 128 + (slot % page) * 4, &scale, 4);
  }
  Buffer<std::uint8_t> q8(DType::kE4M3, {tokens, heads, 128});
  for (auto& c : q8.data) c = f32_to_e4m3(uni(rng));
  Buffer<float> hw(DType::kF32, {tokens, heads});
  layer_test::fill_uniform(hw.data, rng, 0.1f, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {tokens});
  pos.data = {79, 3, 30, 50, 17};
  Buffer<std::int32_t> to_req(DType::kI32, {tokens}, 0);
  for (Backend backend : layer_test::host_backends(Op::kIndexerTopk)) {
    Buffer<std::int32_t> top(DType::kI32, {tokens, top_k}, 77);
    ASSERT_TRUE(IsOk(indexer_topk({q8.view, hw.view, cache.view, pos.view, to_req.view, table.view, -1, false, top.view},
                                  backend)));
    for (int t = 0; t < tokens; ++t) {
      const std::int64_t n = (pos.data[static_cast<std::size_t>(t)] + 1) / 4;
      std::vector<double> logit(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) {
        for (int h = 0; h < heads; ++h) {
          double dot = 0;
          for (int i = 0; i < 128; ++i) {
            dot += e4m3_to_f32(q8.data[static_cast<std::size_t>((t * heads + h) * 128 + i)]) *
                   static_cast<double>(keys[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)]);
          }
          logit[static_cast<std::size_t>(j)] += hw.data[static_cast<std::size_t>(t * heads + h)] * std::max(dot, 0.0);
        }
      }
      const std::int32_t* row = top.data.data() + t * top_k;
      std::vector<bool> chosen(static_cast<std::size_t>(n), false);
      const std::int64_t kept = std::min<std::int64_t>(n, top_k);
      double floor_logit = INFINITY;
      for (std::int64_t k = 0; k < top_k; ++k) {
        if (k >= kept) {
          ASSERT_EQ(row[k], -1) << "token " << t;
          continue;
        }
        ASSERT_GE(row[k], 0);
        ASSERT_LT(row[k], n) << "token " << t << " selected a causally invalid entry";
        chosen[static_cast<std::size_t>(row[k])] = true;
        if (k > 0) {
          ASSERT_GT(row[k], row[k - 1]) << "ascending order, token " << t;
        }
        floor_logit = std::min(floor_logit, logit[static_cast<std::size_t>(row[k])]);
      }
      for (std::int64_t j = 0; j < n; ++j) {
        if (!chosen[static_cast<std::size_t>(j)]) {
          ASSERT_LE(logit[static_cast<std::size_t>(j)], floor_logit + 1e-5 * std::fabs(floor_logit) + 1e-9)
              << backend_name(backend) << " token " << t << " missed entry " << j;
        }
      }
    }
  }
}

TEST(IndexerTopkTest, RejectsMissingPagesAndWritesNothing) {
  HandKeys keys({1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f});
  Buffer<std::uint8_t> q8(DType::kE4M3, {1, 1, 128}, 0);
  Buffer<float> hw(DType::kF32, {1, 1}, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {1}, 27);
  Buffer<std::int32_t> to_req(DType::kI32, {1}, 0), top(DType::kI32, {1, 2}, 77);
  keys.table.data[2] = 5;
  EXPECT_TRUE(FailsWith(indexer_topk({q8.view, hw.view, keys.cache.view, pos.view, to_req.view, keys.table.view, -1,
                                      false, top.view}),
                        StatusCode::kOutOfRange, {"block_table[0][2]", "5"}));
  to_req.data[0] = 1;
  EXPECT_TRUE(FailsWith(indexer_topk({q8.view, hw.view, keys.cache.view, pos.view, to_req.view, keys.table.view, -1,
                                      false, top.view}),
                        StatusCode::kOutOfRange, {"token_to_request[0]"}));
  EXPECT_EQ(top.data, (std::vector<std::int32_t>{77, 77}));
}

}  // namespace
}  // namespace smla
