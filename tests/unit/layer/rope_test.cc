#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "smla/rope.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using layer_test::Buffer;
using testing::FailsWith;
using testing::IsOk;

TEST(RopeTest, SwaOnlyFrequenciesArePlainPowersOfTheta) {
  auto inv = rope_inverse_frequencies(RopeConfig::swa_only());
  ASSERT_TRUE(IsOk(inv.status()));
  EXPECT_DOUBLE_EQ((*inv)[0], 1.0);
  EXPECT_NEAR((*inv)[1], 1.0 / std::pow(10000.0, 2.0 / 64), 1e-15);
  EXPECT_NEAR((*inv)[16], 0.01, 1e-15);  // 10000^(-32/64)
}

TEST(RopeTest, YarnRampBlendsBetweenDimensions15And25) {
  // beta_fast 32 -> floor(64 ln(65536/(64 pi)) / (2 ln 160000)) = 15,
  // beta_slow 1 -> ceil(64 ln(65536/(2 pi)) / (2 ln 160000)) = 25.
  auto inv = rope_inverse_frequencies(RopeConfig::compressed());
  ASSERT_TRUE(IsOk(inv.status()));
  auto plain = [](int p) { return std::pow(160000.0, -2.0 * p / 64); };
  for (int p = 0; p <= 15; ++p) EXPECT_NEAR((*inv)[static_cast<std::size_t>(p)], plain(p), 1e-15 * plain(p)) << p;
  for (int p = 25; p < 32; ++p) EXPECT_NEAR((*inv)[static_cast<std::size_t>(p)], plain(p) / 16, 1e-15) << p;
  // p = 20: ramp 0.5 -> half extrapolated, half interpolated.
  EXPECT_NEAR((*inv)[20], 0.5 * plain(20) + 0.5 * plain(20) / 16, 1e-15);
}

TEST(RopeTest, HandRotationAtPositionOne) {
  auto table = RopeTable::create(RopeConfig::swa_only(), 4);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> x(DType::kF32, {1, 64});
  x.data[0] = 1.0f;   // pair 0 rotates by 1 rad
  x.data[32] = 2.0f;  // pair 16 rotates by 0.01 rad
  x.data[33] = 1.0f;
  Buffer<std::int64_t> pos(DType::kI64, {1}, 1);
  for (Backend backend : layer_test::host_backends(Op::kApplyRope)) {
    std::vector<float> original = x.data;
    ASSERT_TRUE(IsOk(apply_rope({x.view, pos.view, &*table, 0, RopeDirection::kForward}, backend)));
    EXPECT_NEAR(x.data[0], std::cos(1.0), 1e-7);
    EXPECT_NEAR(x.data[1], std::sin(1.0), 1e-7);
    EXPECT_NEAR(x.data[32], 2 * std::cos(0.01) - std::sin(0.01), 1e-6);
    EXPECT_NEAR(x.data[33], 2 * std::sin(0.01) + std::cos(0.01), 1e-6);
    x.data = original;
  }
}

TEST(RopeTest, InverseUndoesForwardWithinF32Rounding) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 70000);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> x(DType::kF32, {5, 3, 512});
  layer_test::fill_uniform(x.data, rng, -4.0f, 4.0f);
  Buffer<std::int32_t> pos(DType::kI32, {5});
  for (int t = 0; t < 5; ++t) pos.data[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(rng() % 70000);
  for (Backend backend : layer_test::host_backends(Op::kApplyRope)) {
    const std::vector<float> original = x.data;
    ASSERT_TRUE(IsOk(apply_rope({x.view, pos.view, &*table, 448, RopeDirection::kForward}, backend)));
    ASSERT_TRUE(IsOk(apply_rope({x.view, pos.view, &*table, 448, RopeDirection::kInverse}, backend)));
    for (std::size_t i = 0; i < x.data.size(); ++i) {
      ASSERT_NEAR(x.data[i], original[i], 4e-6f * 4) << "element " << i << " on " << backend_name(backend);
      if (i % 512 < 448) {
        ASSERT_EQ(x.data[i], original[i]);  // NoPE dims are never touched
      }
    }
  }
}

TEST(RopeTest, CpuMatchesReference) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 5000);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> a(DType::kF32, {7, 2, 128});
  layer_test::fill_uniform(a.data, rng, -1.0f, 1.0f);
  Buffer<float> b(DType::kF32, {7, 2, 128});
  b.data = a.data;
  Buffer<std::int64_t> pos(DType::kI64, {7});
  for (auto& p : pos.data) p = static_cast<std::int64_t>(rng() % 5000);
  ASSERT_TRUE(IsOk(apply_rope({a.view, pos.view, &*table, 64, RopeDirection::kForward}, Backend::kCpu)));
  ASSERT_TRUE(IsOk(apply_rope({b.view, pos.view, &*table, 64, RopeDirection::kForward}, Backend::kReference)));
  for (std::size_t i = 0; i < a.data.size(); ++i) ASSERT_NEAR(a.data[i], b.data[i], 2e-6f) << i;
}

TEST(RopeTest, RejectsBadArguments) {
  auto table = RopeTable::create(RopeConfig::swa_only(), 8);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> x(DType::kF32, {2, 512}, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {2}, 8);
  EXPECT_TRUE(FailsWith(apply_rope({x.view, pos.view, &*table, 448, RopeDirection::kForward}),
                        StatusCode::kOutOfRange, {"positions[0]", "[0, 8)", "8"}));
  pos.data = {0, 1};
  EXPECT_TRUE(FailsWith(apply_rope({x.view, pos.view, &*table, 449, RopeDirection::kForward}),
                        StatusCode::kOutOfRange, {"rope_offset"}));
  EXPECT_TRUE(FailsWith(apply_rope({x.view, pos.view, nullptr, 448, RopeDirection::kForward}),
                        StatusCode::kInvalidArgument, {"table"}));
  // Host tensors on cuda: no cuda context here (not built, no device), or an error naming x.
  EXPECT_FALSE(apply_rope({x.view, pos.view, &*table, 448, RopeDirection::kForward}, Backend::kCuda).ok());
  EXPECT_TRUE(FailsWith(RopeTable::create(RopeConfig::swa_only(), 0).status(), StatusCode::kInvalidArgument,
                        {"max_positions"}));
  for (float v : x.data) EXPECT_EQ(v, 1.0f);  // nothing written on error
}

}  // namespace
}  // namespace smla
