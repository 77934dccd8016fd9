// Plan once, run many: a plan made from shapes runs every call of those shapes
// (other tensors, other values) and refuses calls of other shapes, other
// backends and empty plans, naming what differs.
#include <gtest/gtest.h>

#include <string>

#include "smla/attention.h"
#include "smla/context.h"
#include "testkit/testkit.h"
#include "tests/common/test_common.h"

namespace smla {
namespace {

using testing::FailsWith;
using testing::IsOk;

const testkit::Tolerance kCpuTolerance{1e-2, 1e-2, 1e-4};

testkit::DecodeCaseOptions small_case(std::uint64_t seed) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = 2;
  o.num_heads = 16;
  o.main_topk = 64;
  o.main_page_size = 37;
  o.main_context = 200;
  o.extra_topk = 96;
  o.extra_page_size = 5;
  o.extra_context = 150;
  o.random_lengths = true;
  o.seed = testing::test_seed() + seed;
  return o;
}

Context context_of(Backend backend) {
  auto context = Context::create(backend, TuningOptions{});
  EXPECT_TRUE(IsOk(context.status()));
  return *context;
}

TEST(AttentionPlan, OnePlanRunsEveryCallOfItsShapes) {
  const Context cpu = context_of(Backend::kCpu);
  testkit::DecodeCase first = testkit::make_decode_case(small_case(1));
  SMLA_SEED_TRACE(testing::test_seed());
  auto plan = plan_sparse_decode(cpu, first.args());
  ASSERT_TRUE(IsOk(plan.status()));
  EXPECT_EQ(plan->implementation().name, "cpu");
  EXPECT_EQ(plan->workspace_bytes(), 0u);
  EXPECT_EQ(plan->problem().tokens, 4);
  EXPECT_EQ(plan->problem().keys, 64 + 96);
  EXPECT_NE(plan->describe().find("cpu"), std::string::npos);
  for (std::uint64_t seed : {1u, 2u}) {  // new tensors and values, same shapes
    testkit::DecodeCase c = testkit::make_decode_case(small_case(seed));
    ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
    testkit::HostTensor got_out = c.make_out();
    testkit::HostTensor got_lse = c.make_lse();
    testkit::poison(got_out.view());
    testkit::poison(got_lse.view());
    ASSERT_TRUE(IsOk(sparse_decode(cpu, *plan, c.args_with_outputs(got_out.view(), got_lse.view()))));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_bf16(got_out.view(), c.out().view(), kCpuTolerance), "out"));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_f32(got_lse.view(), c.lse().view(), kCpuTolerance), "lse"));
  }
}

TEST(AttentionPlan, RefusesOtherShapesBackendsAndEmptyPlans) {
  const Context cpu = context_of(Backend::kCpu);
  testkit::DecodeCase c = testkit::make_decode_case(small_case(3));
  auto plan = plan_sparse_decode(cpu, c.args());
  ASSERT_TRUE(IsOk(plan.status()));

  testkit::DecodeCaseOptions wider = small_case(3);
  wider.num_heads = 32;
  testkit::DecodeCase other = testkit::make_decode_case(wider);
  EXPECT_TRUE(FailsWith(sparse_decode(cpu, *plan, other.args()), StatusCode::kInvalidArgument,
                        {"args", "shapes of the plan", "16 heads", "32 heads"}));
  EXPECT_TRUE(FailsWith(sparse_decode(context_of(Backend::kReference), *plan, c.args()), StatusCode::kInvalidArgument,
                        {"plan", "backend 'reference'", "backend 'cpu'"}));
  EXPECT_TRUE(FailsWith(sparse_decode(cpu, AttentionPlan{}, c.args()), StatusCode::kInvalidArgument, {"plan", "empty"}));
  // Validation still runs on every call: a bad tensor is named, not planned around.
  SparseDecodeArgs bad = c.args();
  bad.softmax_scale = -1.0f;
  EXPECT_TRUE(FailsWith(sparse_decode(cpu, *plan, bad), StatusCode::kInvalidArgument, {"softmax_scale"}));
}

TEST(AttentionPlan, PrefillPlansAndWorkspaceQueriesAgree) {
  testkit::PrefillCaseOptions o;
  o.s_q = 3;
  o.s_kv = 40;
  o.num_heads = 8;
  o.topk = 16;
  o.seed = testing::test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::PrefillCase c = testkit::make_prefill_case(o);
  for (Backend backend : {Backend::kReference, Backend::kCpu}) {
    const Context context = context_of(backend);
    auto plan = plan_sparse_prefill(context, c.args());
    ASSERT_TRUE(IsOk(plan.status()));
    EXPECT_EQ(plan->implementation().backend, backend);
    auto bytes = sparse_prefill_workspace_size(context, c.args());
    ASSERT_TRUE(IsOk(bytes.status()));
    EXPECT_EQ(*bytes, plan->workspace_bytes());
  }
}

}  // namespace
}  // namespace smla
