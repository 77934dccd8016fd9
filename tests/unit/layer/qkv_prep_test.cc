#include <gtest/gtest.h>

#include <cmath>

#include "smla/codec.h"
#include "smla/layer.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using layer_test::Buffer;
using layer_test::OwnedKvCache;
using testing::FailsWith;
using testing::IsOk;

TEST(QueryPrepTest, HandCaseNormalizesRotatesAndZeroPadsHeads) {
  auto table = RopeTable::create(RopeConfig::swa_only(), 4);
  ASSERT_TRUE(IsOk(table.status()));
  // Head 0: every value 3 -> RMS 3 -> all ones; at position 1 pair 0 (dims 448, 449)
  // rotates (1, 1) by 1 rad -> (cos1 - sin1, sin1 + cos1).
  Buffer<float> q(DType::kF32, {1, 1, 512}, 3.0f);
  Buffer<std::int64_t> pos(DType::kI64, {1}, 1);
  for (Backend backend : layer_test::host_backends(Op::kPrepareQuery)) {
    Buffer<std::uint16_t> out(DType::kBF16, {1, 3, 512}, 0x7FC0);  // NaN-poisoned
    ASSERT_TRUE(IsOk(prepare_query({q.view, pos.view, &*table, 1e-6f, out.view}, backend)));
    EXPECT_EQ(bf16_to_f32(out.data[0]), 1.0f);
    EXPECT_EQ(bf16_to_f32(out.data[447]), 1.0f);
    EXPECT_NEAR(bf16_to_f32(out.data[448]), std::cos(1.0) - std::sin(1.0), 4e-3);
    EXPECT_NEAR(bf16_to_f32(out.data[449]), std::sin(1.0) + std::cos(1.0), 8e-3);
    for (int i = 512; i < 3 * 512; ++i) ASSERT_EQ(out.data[static_cast<std::size_t>(i)], 0) << backend_name(backend);
  }
}

TEST(QueryPrepTest, CpuMatchesReferenceOnStridedInput) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 3000);
  ASSERT_TRUE(IsOk(table.status()));
  const int tokens = 6, heads = 3;
  // q is a strided view: every token row carries one padding head.
  Buffer<std::uint16_t> storage(DType::kBF16, {tokens, heads + 1, 512});
  for (auto& v : storage.data) v = f32_to_bf16(std::uniform_real_distribution<float>(-5, 5)(rng));
  TensorView q = TensorView::strided(storage.data.data(), DType::kBF16, {tokens, heads, 512},
                                     {(heads + 1) * 512, 512, 1});
  Buffer<std::int32_t> pos(DType::kI32, {tokens});
  for (auto& p : pos.data) p = static_cast<std::int32_t>(rng() % 3000);
  Buffer<std::uint16_t> cpu(DType::kBF16, {tokens, 4, 512}, 0x7FC0), ref(DType::kBF16, {tokens, 4, 512}, 0x7FC0);
  ASSERT_TRUE(IsOk(prepare_query({q, pos.view, &*table, 1e-6f, cpu.view}, Backend::kCpu)));
  ASSERT_TRUE(IsOk(prepare_query({q, pos.view, &*table, 1e-6f, ref.view}, Backend::kReference)));
  for (std::size_t i = 0; i < cpu.data.size(); ++i) {
    const float a = bf16_to_f32(cpu.data[i]), b = bf16_to_f32(ref.data[i]);
    ASSERT_NEAR(a, b, 1e-2f * std::fabs(b) + 1e-6f) << i;  // one bf16 ulp at most
  }
}

TEST(KvPrepTest, InsertsRotatedBf16RowsAndSkipsMinusOne) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::swa_only(), 100);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> kv(DType::kF32, {3, 512});
  layer_test::fill_uniform(kv.data, rng, -2, 2);
  Buffer<std::int64_t> pos(DType::kI64, {3});
  pos.data = {0, 5, 9};
  Buffer<std::int64_t> slots(DType::kI64, {3});
  slots.data = {4, -1, 0};
  OwnedKvCache cache(KvFormat::kBf16Rows, 3, 3);  // odd page size
  Buffer<std::uint16_t> rotated(DType::kBF16, {3, 512});
  ASSERT_TRUE(IsOk(prepare_kv({kv.view, pos.view, &*table, slots.view, cache.view, rotated.view})));
  auto row_at = [&](std::int64_t slot) {
    return reinterpret_cast<const std::uint16_t*>(cache.bytes.data()) +
           (slot / 3) * cache.view.pages.stride[0] + (slot % 3) * 512;
  };
  // Position 0: no rotation, plain bf16 rounding of the input.
  for (int i = 0; i < 512; ++i) ASSERT_EQ(row_at(4)[i], f32_to_bf16(kv.data[static_cast<std::size_t>(i)]));
  // Position 9, pair 0 rotated by 9 rad.
  const float e = kv.data[1024 + 448], o = kv.data[1024 + 449];
  EXPECT_NEAR(bf16_to_f32(row_at(0)[448]), e * std::cos(9.0) - o * std::sin(9.0), 2e-2);
  EXPECT_NEAR(bf16_to_f32(row_at(0)[449]), e * std::sin(9.0) + o * std::cos(9.0), 2e-2);
  for (int i = 0; i < 512; ++i) ASSERT_EQ(row_at(0)[i], rotated.data[static_cast<std::size_t>(1024 + i)]);
  // Every other slot keeps its poison.
  for (std::int64_t s : {1, 2, 3, 5, 6, 7, 8}) EXPECT_EQ(row_at(s)[0], 0xFFFF) << s;
}

TEST(KvPrepTest, Fp8CacheCpuMatchesReference) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 4096);
  ASSERT_TRUE(IsOk(table.status()));
  const int tokens = 9;
  Buffer<float> kv(DType::kF32, {tokens, 512});
  layer_test::fill_uniform(kv.data, rng, -3, 3);
  Buffer<std::int64_t> pos(DType::kI64, {tokens}), slots(DType::kI64, {tokens});
  for (int t = 0; t < tokens; ++t) {
    pos.data[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(rng() % 4096);
    slots.data[static_cast<std::size_t>(t)] = t;
  }
  OwnedKvCache a(KvFormat::kV4Fp8, 2, 5), b(KvFormat::kV4Fp8, 2, 5);
  ASSERT_TRUE(IsOk(prepare_kv({kv.view, pos.view, &*table, slots.view, a.view, {}}, Backend::kCpu)));
  ASSERT_TRUE(IsOk(prepare_kv({kv.view, pos.view, &*table, slots.view, b.view, {}}, Backend::kReference)));
  Buffer<float> ra(DType::kF32, {tokens, 512}), rb(DType::kF32, {tokens, 512});
  ASSERT_TRUE(IsOk(gather_from_cache(a.view, slots.view, ra.view)));
  ASSERT_TRUE(IsOk(gather_from_cache(b.view, slots.view, rb.view)));
  for (std::size_t i = 0; i < ra.data.size(); ++i) {
    // fp8 NoPE: a rounding flip costs one e4m3 step (2^-3 relative) of the tile scale.
    ASSERT_NEAR(ra.data[i], rb.data[i], 0.07f * std::max(1.0f, std::fabs(rb.data[i]))) << i;
  }
}

TEST(KvPrepTest, BadSlotFailsAndWritesNothing) {
  auto table = RopeTable::create(RopeConfig::swa_only(), 16);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> kv(DType::kF32, {2, 512}, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {2}, 0), slots(DType::kI64, {2});
  slots.data = {0, 6};
  OwnedKvCache cache(KvFormat::kBf16Rows, 2, 3);
  const auto before = cache.bytes;
  EXPECT_TRUE(FailsWith(prepare_kv({kv.view, pos.view, &*table, slots.view, cache.view, {}}),
                        StatusCode::kOutOfRange, {"slot_mapping[1]", "[0, 6)", "6"}));
  EXPECT_EQ(cache.bytes, before);
  slots.data = {0, -2};
  EXPECT_FALSE(prepare_kv({kv.view, pos.view, &*table, slots.view, cache.view, {}}).ok());
  EXPECT_EQ(cache.bytes, before);
  OwnedKvCache v32(KvFormat::kV32Fp8, 1, 2);
  slots.data = {0, 1};
  EXPECT_TRUE(FailsWith(prepare_kv({kv.view, pos.view, &*table, slots.view, v32.view, {}}),
                        StatusCode::kInvalidArgument, {"cache", "512-dim"}));
}

}  // namespace
}  // namespace smla
