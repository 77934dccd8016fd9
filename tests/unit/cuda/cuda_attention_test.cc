// The CUDA attention kernels against the float64 reference backend on random
// testkit cases: both KV sources, every format, head counts 1..128, per-token
// lengths, out-of-range indices, strided views, odd page sizes, split and
// unsplit launches, the explicit-workspace API and CUDA-graph replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "smla/attention.h"
#include "smla/context.h"
#include "smla/registry.h"
#include "tests/common/test_common.h"
#include "tests/unit/cuda/attention_expect.h"
#include "tests/unit/cuda/cuda_context.h"
#include "testkit/cuda/device_copy.h"
#include "testkit/testkit.h"

namespace smla {
namespace {

using cudatest::DeviceBuffer;
using cudatest::DeviceDecodeArgs;
using cudatest::DevicePrefillArgs;
using testing::IsOk;
using testing::WithinTolerance;

using cudatest::expect_decode_matches;
using cudatest::expect_prefill_matches;
using cudatest::kOutTolerance;
using cudatest::kStatTolerance;

testkit::DecodeCaseOptions small_v4_case() {
  testkit::DecodeCaseOptions o;
  o.num_requests = 3;
  o.s_q = 2;
  o.num_heads = 64;
  o.main_topk = 128;
  o.main_page_size = 64;
  o.main_context = 300;
  o.extra_topk = 192;
  o.extra_page_size = 64;
  o.extra_context = 400;
  return o;
}

TEST(CudaSparseDecode, V4TwoSourcesMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  expect_decode_matches(small_v4_case(), "v4 h64 main+extra");
}

TEST(CudaSparseDecode, HeadCountsFromOneTo128) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t heads : {1, 3, 8, 16, 24, 32, 48, 64, 80, 128}) {
    testkit::DecodeCaseOptions o = small_v4_case();
    o.num_heads = heads;
    o.seed = static_cast<std::uint64_t>(heads);
    expect_decode_matches(o, "heads " + std::to_string(heads));
  }
}

TEST(CudaSparseDecode, RandomLengthsInvalidIndicesAndOddPages) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_v4_case();
  o.random_lengths = true;
  o.invalid_index_fraction = 0.2;
  o.main_page_size = 37;
  o.extra_page_size = 3;
  o.s_q = 3;
  expect_decode_matches(o, "lengths + invalid + pages 37/3");
}

TEST(CudaSparseDecode, StridedViews) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_v4_case();
  o.strided = true;
  o.num_heads = 40;
  expect_decode_matches(o, "strided");
}

TEST(CudaSparseDecode, MainCacheOnlyAndEmptyRows) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_v4_case();
  o.extra_topk = 0;
  o.random_lengths = true;  // some tokens draw length 0: out 0, lse +inf
  o.num_requests = 6;
  expect_decode_matches(o, "main only");
}

TEST(CudaSparseDecode, V32Format) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o;
  o.format = KvFormat::kV32Fp8;
  o.num_requests = 2;
  o.num_heads = 128;
  o.main_topk = 256;
  o.main_context = 600;
  o.extra_topk = 0;
  o.random_lengths = true;
  o.invalid_index_fraction = 0.1;
  expect_decode_matches(o, "v3.2 h128");
  o.num_heads = 16;
  o.strided = true;
  expect_decode_matches(o, "v3.2 h16 strided");
}

TEST(CudaSparseDecode, PlainRowFormats) {
  SKIP_WITHOUT_DEVICE();
  for (KvFormat format : {KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    testkit::DecodeCaseOptions o = small_v4_case();
    o.format = format;
    o.num_heads = 32;
    o.random_lengths = true;
    expect_decode_matches(o, std::string(kv_format_name(format)));
  }
}

TEST(CudaSparseDecode, ManyTokensDirectPrefillFromCaches) {
  SKIP_WITHOUT_DEVICE();
  // Prefill straight from the FP8 paged caches: many query tokens, each with its
  // own index lists and lengths; enough CTAs that nothing is split.
  testkit::DecodeCaseOptions o = small_v4_case();
  o.num_requests = 24;
  o.s_q = 8;
  o.num_heads = 64;
  o.random_lengths = true;
  expect_decode_matches(o, "192 tokens");
}

// The explicit-workspace API on a user stream; a too-small workspace is refused.
TEST(CudaSparseDecode, ExplicitWorkspaceOnStream) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_v4_case();
  o.num_requests = 1;
  o.s_q = 1;  // one token: the keys are split across CTAs
  o.seed = testing::test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::DecodeCase c = testkit::make_decode_case(o);
  ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
  testkit::HostTensor got_out = c.make_out();
  testkit::HostTensor got_lse = c.make_lse();
  testkit::poison(got_out.view());
  testkit::poison(got_lse.view());
  DeviceDecodeArgs device(c.args_with_outputs(got_out.view(), got_lse.view()));

  Context context = cudatest::cuda_context();
  auto plan = plan_sparse_decode(context, device.args);
  ASSERT_TRUE(IsOk(plan.status()));
  const std::size_t bytes = plan->workspace_bytes();
  ASSERT_GT(bytes, 0u) << "a single token should be split over keys: " << plan->describe();
  auto queried = sparse_decode_workspace_size(context, device.args);
  ASSERT_TRUE(IsOk(queried.status()));
  EXPECT_EQ(*queried, bytes);
  DeviceBuffer workspace(bytes);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  context.set_stream(stream);
  context.set_workspace(workspace.data(), bytes - 1);
  EXPECT_TRUE(testing::FailsWith(sparse_decode(context, *plan, device.args), StatusCode::kInvalidArgument,
                                 {"workspace"}));
  context.set_workspace(workspace.data(), bytes);
  ASSERT_TRUE(IsOk(sparse_decode(context, *plan, device.args)));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  cudatest::copy_to_host(*device.out, got_out.view());
  cudatest::copy_to_host(*device.lse, got_lse.view());
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(got_out.view(), c.out().view(), kOutTolerance), "out"));
  EXPECT_TRUE(WithinTolerance(testkit::compare_f32(got_lse.view(), c.lse().view(), kStatTolerance), "lse"));
}

// Captured once, replayed after the length VALUES change on the device: the
// graph must follow the new lengths (nothing was planned from them on the host).
TEST(CudaSparseDecode, GraphReplayFollowsNewLengths) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_v4_case();
  o.num_requests = 2;
  o.random_lengths = true;
  o.seed = testing::test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::DecodeCase c = testkit::make_decode_case(o);
  cudatest::expect_graph_replay_follows_new_lengths(c, 1, &cudatest::halve_lengths);
}

TEST(CudaSparseDecode, RejectsHostTensors) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCase c = testkit::make_decode_case(small_v4_case());
  const Status status = sparse_decode(c.args(), Backend::kCuda);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cuda"), std::string::npos) << status.to_string();
}

// Every tensor must sit on the context's device, not only q: a view tagged with
// another device index is refused before anything is read.
TEST(CudaSparseDecode, RejectsTensorsOfAnotherDevice) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCase c = testkit::make_decode_case(small_v4_case());
  DeviceDecodeArgs device(c.args());
  const Context context = cudatest::cuda_context();
  const Device elsewhere{DeviceKind::kCuda, context.device().ordinal + 1};
  for (TensorView SparseDecodeArgs::*member : {&SparseDecodeArgs::out, &SparseDecodeArgs::main_indices,
                                                &SparseDecodeArgs::extra_indices, &SparseDecodeArgs::lse}) {
    SparseDecodeArgs args = device.args;
    (args.*member).device = elsewhere;
    EXPECT_TRUE(testing::FailsWith(sparse_decode(context, args), StatusCode::kInvalidArgument,
                                   {"cuda:" + std::to_string(elsewhere.index)}));
  }
  SparseDecodeArgs args = device.args;
  args.main_cache.pages.device = elsewhere;
  EXPECT_TRUE(testing::FailsWith(sparse_decode(context, args), StatusCode::kInvalidArgument, {"main_cache"}));
}

// A host case's arguments labelled as on CUDA device 0, for a validating context (nothing runs).
SparseDecodeArgs labelled_cuda0(SparseDecodeArgs args) {
  const Device cuda0{DeviceKind::kCuda, 0};
  for (TensorView* view : {&args.q, &args.main_indices, &args.main_lengths, &args.extra_indices, &args.extra_lengths,
                           &args.sink, &args.out, &args.lse}) {
    if (view->present()) view->device = cuda0;
  }
  args.main_cache.pages.device = cuda0;
  if (args.extra_cache.has_value()) args.extra_cache->pages.device = cuda0;
  return args;
}

bool build_has_sm90_decode() {
  for (const Implementation& row : implementations()) {
    if (row.name == "cuda.sm90" && row.op == Op::kSparseDecode) return true;
  }
  return false;
}

// Without touching a device: a validating context of a nominal H100 checks the
// arguments, selects and plans as on that card, and runs nothing. Runs on
// machines without a GPU too.
TEST(CudaSparseDecode, ValidatingContextPlansForANominalH100) {
  auto context = Context::create_validating(Backend::kCuda, testing::nominal_h100());
  ASSERT_TRUE(IsOk(context.status()));
  testkit::DecodeCase c = testkit::make_decode_case(small_v4_case());
  SparseDecodeArgs args = labelled_cuda0(c.args());

  auto plan = plan_sparse_decode(*context, args);
  ASSERT_TRUE(IsOk(plan.status()));
  if (build_has_sm90_decode()) {  // the Hopper kernel when this build has it
    EXPECT_EQ(plan->implementation().name, "cuda.sm90");
  }
  EXPECT_TRUE(testing::FailsWith(sparse_decode(*context, *plan, args), StatusCode::kUnimplemented,
                                 {"validating context", "nothing ran"}));
  EXPECT_EQ(testkit::count_poisoned(c.out().view()), c.out().view().numel());

  SparseDecodeArgs host_q = args;
  host_q.q.device = Device{DeviceKind::kCpu, 0};
  EXPECT_TRUE(testing::FailsWith(sparse_decode(*context, host_q), StatusCode::kInvalidArgument, {"q", "cuda"}));
  SparseDecodeArgs other_device = args;  // device indices are checked where the call would run
  other_device.out.device = Device{DeviceKind::kCuda, 1};
  EXPECT_FALSE(sparse_decode(*context, other_device).ok());
}

// What a plan's description says of CTA pairs (benchmark logs read it): the two 64-head
// blocks of an h_q 128 token pair up on the sm90 kernel of FP8 rows, unsplit; h_q 64 has one
// block; the portable kernel never pairs.
TEST(CudaSparseDecode, PlanDescriptionNamesCtaPairs) {
  auto context = Context::create_validating(Backend::kCuda, testing::nominal_h100());
  ASSERT_TRUE(IsOk(context.status()));
  auto describe = [&](std::int64_t heads, const Context& on) {
    testkit::DecodeCaseOptions o = small_v4_case();
    o.num_heads = heads;
    o.num_requests = 80;  // 160 tokens: 320 CTAs of 64 heads at h_q 128, more than a wave, so unsplit
    testkit::DecodeCase c = testkit::make_decode_case(o);
    auto plan = plan_sparse_decode(on, labelled_cuda0(c.args()));
    EXPECT_TRUE(IsOk(plan.status()));
    return plan.ok() ? plan->describe() : std::string();
  };
  if (build_has_sm90_decode()) {
    const std::string paired = describe(128, *context);
    EXPECT_NE(paired.find("cuda.sm90"), std::string::npos) << paired;
    EXPECT_NE(paired.find(", CTA pairs"), std::string::npos) << paired;
    const std::string h64 = describe(64, *context);
    EXPECT_EQ(h64.find("CTA pairs"), std::string::npos) << h64;
  }
  TuningOptions portable_only;
  portable_only.implementation = "cuda.portable";
  auto portable_context = Context::create_validating(Backend::kCuda, testing::nominal_h100(), portable_only);
  ASSERT_TRUE(IsOk(portable_context.status()));
  const std::string portable = describe(128, *portable_context);
  EXPECT_EQ(portable.find("CTA pairs"), std::string::npos) << portable;
}

TEST(CudaSparsePrefill, FlatBf16WorkspaceMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  testkit::PrefillCaseOptions o;
  o.s_q = 12;
  o.s_kv = 700;
  o.num_heads = 64;
  o.topk = 160;
  expect_prefill_matches(o, "d512 h64");
  o.d_qk = 576;
  o.num_heads = 128;
  o.strided = true;
  expect_prefill_matches(o, "d576 h128 strided");
  o.d_qk = 512;
  o.num_heads = 5;
  o.s_q = 1;  // split over keys
  o.strided = false;
  expect_prefill_matches(o, "d512 h5 one query");
}

}  // namespace
}  // namespace smla
