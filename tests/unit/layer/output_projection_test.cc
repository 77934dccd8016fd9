#include <gtest/gtest.h>

#include <cmath>

#include "smla/layer.h"
#include "tests/common/test_common.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using layer_test::Buffer;
using testing::FailsWith;
using testing::IsOk;

// wo_a row 0 reads head 0 dim 0, row 1 reads head 1 dim 448; wo_b = [[1,0],[0,1],[2,3]].
// Head 1 holds (cos p, sin p) at dims 448/449, i.e. (1, 0) rotated forward by
// p rad: the inverse rotation must give z1 = 1.
TEST(OutputProjectionTest, HandCaseUndoesTheRotation) {
  auto table = RopeTable::create(RopeConfig::swa_only(), 16);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> o(DType::kF32, {2, 2, 512}, 0.0f);
  Buffer<std::int64_t> pos(DType::kI64, {2});
  pos.data = {3, 7};
  for (int t = 0; t < 2; ++t) {
    const double p = static_cast<double>(pos.data[static_cast<std::size_t>(t)]);
    o.data[static_cast<std::size_t>(t * 1024)] = 0.5f + static_cast<float>(t);
    o.data[static_cast<std::size_t>(t * 1024 + 512 + 448)] = static_cast<float>(std::cos(p));
    o.data[static_cast<std::size_t>(t * 1024 + 512 + 449)] = static_cast<float>(std::sin(p));
  }
  Buffer<float> wo_a(DType::kF32, {1, 2, 1024}, 0.0f);
  wo_a.data[0] = 1.0f;
  wo_a.data[1024 + 512 + 448] = 1.0f;
  Buffer<float> wo_b(DType::kF32, {3, 2});
  wo_b.data = {1, 0, 0, 1, 2, 3};
  for (Backend backend : layer_test::host_backends(Op::kProjectOutput)) {
    Buffer<float> out(DType::kF32, {2, 3}, layer_test::kNaN);
    ASSERT_TRUE(IsOk(project_output({o.view, 0, pos.view, &*table, wo_a.view, wo_b.view, out.view}, backend)));
    for (int t = 0; t < 2; ++t) {
      const float o00 = 0.5f + static_cast<float>(t);
      EXPECT_NEAR(out.data[static_cast<std::size_t>(t * 3)], o00, 1e-6);
      EXPECT_NEAR(out.data[static_cast<std::size_t>(t * 3 + 1)], 1.0f, 1e-6);
      EXPECT_NEAR(out.data[static_cast<std::size_t>(t * 3 + 2)], 2 * o00 + 3, 1e-5);
    }
  }
}

TEST(OutputProjectionTest, CpuMatchesReferenceWithPaddedHeads) {
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto table = RopeTable::create(RopeConfig::compressed(), 10000);
  ASSERT_TRUE(IsOk(table.status()));
  const int tokens = 5, heads = 4, padded = 6, groups = 2, rank = 16, hidden = 24;
  Buffer<std::uint16_t> o(DType::kBF16, {tokens, padded, 512});
  for (auto& v : o.data) v = f32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
  for (int t = 0; t < tokens; ++t) {  // padded heads are garbage and must be ignored
    for (int i = heads * 512; i < padded * 512; ++i) o.data[static_cast<std::size_t>(t * padded * 512 + i)] = 0x7FC0;
  }
  Buffer<std::int32_t> pos(DType::kI32, {tokens});
  for (auto& p : pos.data) p = static_cast<std::int32_t>(rng() % 10000);
  Buffer<std::uint16_t> wo_a_bf16(DType::kBF16, {groups, rank, heads / groups * 512});
  for (auto& v : wo_a_bf16.data) v = f32_to_bf16(std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng));
  Buffer<float> wo_a(DType::kF32, {groups, rank, heads / groups * 512});
  ASSERT_TRUE(IsOk(convert_bf16_to_f32(wo_a_bf16.view, wo_a.view)));
  Buffer<float> wo_b(DType::kF32, {hidden, groups * rank});
  layer_test::fill_uniform(wo_b.data, rng, -0.2f, 0.2f);
  Buffer<float> a(DType::kF32, {tokens, hidden}, layer_test::kNaN), b(DType::kF32, {tokens, hidden}, layer_test::kNaN);
  const OutputProjectionArgs base{o.view, heads, pos.view, &*table, wo_a.view, wo_b.view, a.view};
  ASSERT_TRUE(IsOk(project_output(base, Backend::kCpu)));
  OutputProjectionArgs ref = base;
  ref.out = b.view;
  ASSERT_TRUE(IsOk(project_output(ref, Backend::kReference)));
  for (std::size_t i = 0; i < a.data.size(); ++i) ASSERT_NEAR(a.data[i], b.data[i], 1e-4f) << i;
}

TEST(OutputProjectionTest, RejectsGroupMismatch) {
  auto table = RopeTable::create(RopeConfig::swa_only(), 4);
  ASSERT_TRUE(IsOk(table.status()));
  Buffer<float> o(DType::kF32, {1, 3, 512}, 0.0f);
  Buffer<std::int64_t> pos(DType::kI64, {1}, 0);
  Buffer<float> wo_a(DType::kF32, {2, 4, 512}), wo_b(DType::kF32, {5, 8}), out(DType::kF32, {1, 5}, 9.0f);
  EXPECT_TRUE(FailsWith(project_output({o.view, 0, pos.view, &*table, wo_a.view, wo_b.view, out.view}),
                        StatusCode::kInvalidArgument, {"wo_a", "dividing the 3 heads"}));
  EXPECT_EQ(out.data, std::vector<float>(5, 9.0f));
}

}  // namespace
}  // namespace smla
