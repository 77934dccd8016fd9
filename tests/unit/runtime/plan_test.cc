// Plan once, run many: a plan made from shapes runs every call of those shapes
// (other tensors, other values) and refuses calls of other shapes, other
// backends and empty plans, naming what differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "smla/attention.h"
#include "smla/context.h"
#include "smla/registry.h"
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

// A validating context checks, selects and plans like any other, then runs
// nothing: the outputs keep their poison and no memory is allocated.
TEST(ValidatingContext, ChecksArgumentsAndRunsNothing) {
  EXPECT_TRUE(FailsWith(Context::create_validating(Backend::kAuto, {}).status(), StatusCode::kInvalidArgument,
                        {"backend", "auto"}));
  auto validating = Context::create_validating(Backend::kCpu, {});
  ASSERT_TRUE(IsOk(validating.status()));
  EXPECT_TRUE(validating->validates_only());
  EXPECT_FALSE(context_of(Backend::kCpu).validates_only());
  EXPECT_EQ(validating->device().name, "host");

  testkit::DecodeCase c = testkit::make_decode_case(small_case(3));
  SMLA_SEED_TRACE(testing::test_seed());
  auto plan = plan_sparse_decode(*validating, c.args());
  ASSERT_TRUE(IsOk(plan.status()));
  EXPECT_EQ(plan->implementation().name, "cpu");
  EXPECT_TRUE(FailsWith(sparse_decode(*validating, c.args()), StatusCode::kUnimplemented,
                        {"validating context", "passed every check", "nothing ran"}));
  EXPECT_TRUE(FailsWith(sparse_decode(*validating, *plan, c.args()), StatusCode::kUnimplemented,
                        {"validating context"}));
  EXPECT_EQ(testkit::count_poisoned(c.out().view()), c.out().view().numel()) << "a validating context wrote out";
  EXPECT_EQ(testkit::count_poisoned(c.lse().view()), c.lse().view().numel()) << "a validating context wrote lse";

  SparseDecodeArgs bad = c.args();
  bad.softmax_scale = -1.0f;
  EXPECT_TRUE(FailsWith(sparse_decode(*validating, bad), StatusCode::kInvalidArgument, {"softmax_scale"}));
  bad = c.args();
  bad.main_indices.dtype = DType::kI64;
  EXPECT_TRUE(FailsWith(sparse_decode(*validating, bad), StatusCode::kInvalidArgument, {"main_indices"}));

  auto scratch = validating->scratch(std::size_t{1} << 40);  // allocating this much would fail
  ASSERT_TRUE(IsOk(scratch.status()));
  EXPECT_EQ(*scratch, nullptr);
  Context with_workspace = *validating;
  with_workspace.set_workspace(nullptr, 16);
  EXPECT_TRUE(FailsWith(with_workspace.scratch(64).status(), StatusCode::kInvalidArgument, {"workspace", "64"}));
}

TEST(ValidatingContext, CudaNeedsItsDeviceProperties) {
  const DeviceProperties h100 = testing::nominal_h100();
  auto context = Context::create_validating(Backend::kCuda, h100);
  const auto& rows = implementations();
  const bool cuda_compiled = std::any_of(rows.begin(), rows.end(), [](const Implementation& row) {
    return row.backend == Backend::kCuda;
  });
  if (!cuda_compiled) {
    EXPECT_TRUE(FailsWith(context.status(), StatusCode::kUnimplemented, {"cuda", "not compiled"}));
    return;
  }
  ASSERT_TRUE(IsOk(context.status()));
  EXPECT_EQ(context->device().multiprocessors, 132);
  DeviceProperties missing = h100;
  missing.compute_capability = 0;
  EXPECT_TRUE(FailsWith(Context::create_validating(Backend::kCuda, missing).status(), StatusCode::kInvalidArgument,
                        {"device", "compute capability 0"}));
}

}  // namespace
}  // namespace smla
