// Packed MTP attention on the CUDA backend (SparseDecodeArgs::queries_per_request):
// a request's tokens x heads share one CTA over the union of their keys. Every
// case runs packed and unpacked against the float64 reference backend, over
// index lists shaped to stress the union: overlapping sliding windows, identical,
// disjoint, duplicated entries (matched occurrence by occurrence), zero
// lengths, out-of-range and -1 entries; split and unsplit launches. Plus the
// host-side validation of queries_per_request.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "smla/attention.h"
#include "src/cuda/attention_plan.h"
#include "tests/common/test_common.h"
#include "tests/unit/cuda/attention_expect.h"
#include "testkit/cuda/device_copy.h"
#include "testkit/testkit.h"

namespace smla {
namespace {

using cudatest::DeviceDecodeArgs;
using testing::FailsWith;
using testing::IsOk;
using testing::WithinTolerance;

// bf16 inputs and P, f32 accumulation, bf16 output (as cuda_attention_test.cc).
using cudatest::kOutTolerance;
using cudatest::kStatTolerance;

// One index set (main or extra) of a host case, editable per token.
struct IndexLists {
  TensorView indices;  // [T, width] i32
  TensorView lengths;  // [T] i32
  std::int64_t width() const { return indices.shape[1]; }
  std::int32_t& at(std::int64_t t, std::int64_t k) const { return *indices.ptr_at<std::int32_t>({t, k}); }
  std::int32_t& length(std::int64_t t) const { return *lengths.ptr_at<std::int32_t>({t}); }
};

// Reshapes the lists of a case; s_q = tokens per request. Edits only ever point
// entries at slots some token attended before (other rows hold NaN poison) or
// make them unattended.
using Shaper = std::function<void(const IndexLists&, std::int64_t s_q)>;

void keep_as_generated(const IndexLists&, std::int64_t) {}

// Every token of a request gets the request's first token's list and length.
void identical_lists(const IndexLists& lists, std::int64_t s_q) {
  const std::int64_t tokens = lists.indices.shape[0];
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t first = t - t % s_q;
    for (std::int64_t k = 0; k < lists.width(); ++k) lists.at(t, k) = lists.at(first, k);
    lists.length(t) = lists.length(first);
  }
}

// Token j of a request keeps only the slots with slot % s_q == j: no key is shared.
void disjoint_lists(const IndexLists& lists, std::int64_t s_q) {
  const std::int64_t tokens = lists.indices.shape[0];
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t k = 0; k < lists.width(); ++k) {
      std::int32_t& entry = lists.at(t, k);
      if (entry >= 0 && entry % s_q != t % s_q) entry = -1;
    }
  }
}

// Token t repeats entries with a token-dependent period, so the same key occurs
// a different number of times in different tokens' lists (and up to 3 times in one).
void duplicate_entries(const IndexLists& lists, std::int64_t) {
  const std::int64_t tokens = lists.indices.shape[0];
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t period = 2 + t % 3;
    for (std::int64_t k = 1; k < lists.width(); ++k) {
      if (k % period != 0) lists.at(t, k) = lists.at(t, k - 1 - (k % 2 == 0 && k >= 2 ? 1 : 0));
    }
  }
}

// Zero lengths: every other token of each request, and every token of request 0.
void zero_lengths(const IndexLists& lists, std::int64_t s_q) {
  const std::int64_t tokens = lists.indices.shape[0];
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (t < s_q || t % 2 == 1) lists.length(t) = 0;
  }
}

// -1 and far out-of-range entries mixed into the lists (the case adds random invalid values too).
void invalid_entries(const IndexLists& lists, std::int64_t) {
  const std::int64_t tokens = lists.indices.shape[0];
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t k = t % 3; k < lists.width(); k += 3) lists.at(t, k) = k % 2 == 0 ? -1 : INT32_MAX - k;
  }
}

struct Scenario {
  std::string name;
  Shaper shape;
  double invalid_fraction = 0.0;
  float extra_fp8_scale_factor = 1.0f;  // plain fp8 rows: the extra cache read with another per-tensor scale
};

std::vector<Scenario> scenarios() {
  return {{"overlapping windows", keep_as_generated, 0.0}, {"identical lists", identical_lists, 0.0},
          {"disjoint lists", disjoint_lists, 0.0},         {"duplicates", duplicate_entries, 0.0},
          {"zero lengths", zero_lengths, 0.0},             {"invalid entries", invalid_entries, 0.2}};
}

struct DeviceResult {
  testkit::HostTensor out;
  testkit::HostTensor lse;
};

// pack_max_rows: -1 the tuned rule; 32 / 64 the plain rule within that many rows
// (packs the most tokens, so every tile size is tested packed).
DeviceResult run_cuda(const testkit::DecodeCase& c, SparseDecodeArgs host, std::int64_t queries_per_request,
                      int pack_max_rows = -1) {
  DeviceResult result{c.make_out(), c.make_lse()};
  testkit::poison(result.out.view());
  testkit::poison(result.lse.view());
  host.out = result.out.view();
  host.lse = result.lse.view();
  host.queries_per_request = queries_per_request;
  DeviceDecodeArgs device(host);
  TuningOptions tuning;
  tuning.pack_max_rows = pack_max_rows;
  EXPECT_TRUE(IsOk(sparse_decode(cudatest::cuda_context(tuning), device.args)))
      << "queries_per_request " << queries_per_request;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudatest::copy_to_host(*device.out, result.out.view());
  cudatest::copy_to_host(*device.lse, result.lse.view());
  return result;
}

// Shapes the case's lists, then checks packed (queries_per_request = s_q) and
// unpacked results against the reference and against each other.
void expect_packed_matches(testkit::DecodeCaseOptions options, const Scenario& scenario, const std::string& what) {
  options.seed = testing::test_seed() + options.seed;
  options.invalid_index_fraction = scenario.invalid_fraction;
  SMLA_SEED_TRACE(options.seed);
  SCOPED_TRACE(what + ", " + scenario.name);
  testkit::DecodeCase c = testkit::make_decode_case(options);
  SparseDecodeArgs host = c.args();
  scenario.shape(IndexLists{host.main_indices, host.main_lengths}, options.s_q);
  if (host.extra_cache.has_value()) {
    scenario.shape(IndexLists{host.extra_indices, host.extra_lengths}, options.s_q);
    host.extra_cache->fp8_scale *= scenario.extra_fp8_scale_factor;
  }
  ASSERT_TRUE(IsOk(sparse_decode(host, Backend::kReference)));

  const DeviceResult unpacked = run_cuda(c, host, 1);
  EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(unpacked.out.view(), c.out().view(), kOutTolerance), "unpacked out"));
  for (int max_rows : {-1, 32, 64}) {
    SCOPED_TRACE("packing rule: " + (max_rows < 0 ? std::string("tuned") : std::to_string(max_rows)));
    const DeviceResult packed = run_cuda(c, host, options.s_q, max_rows);
    EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(packed.out.view(), c.out().view(), kOutTolerance), "packed out"));
    EXPECT_TRUE(WithinTolerance(testkit::compare_f32(packed.lse.view(), c.lse().view(), kStatTolerance), "packed lse"));
    EXPECT_TRUE(WithinTolerance(testkit::compare_bf16(packed.out.view(), unpacked.out.view(), kOutTolerance),
                                "packed vs unpacked"));
  }
}

// Two requests: few CTAs, so the keys are split across CTAs and combined.
testkit::DecodeCaseOptions small_case(std::int64_t heads, int s_q) {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = s_q;
  o.num_heads = heads;
  o.main_topk = 64;
  o.main_page_size = 37;
  o.main_context = 150;
  o.extra_topk = 96;
  o.extra_page_size = 5;
  o.extra_context = 160;
  return o;
}

void run_matrix(std::int64_t heads) {
  std::uint64_t seed = static_cast<std::uint64_t>(heads) * 100;
  for (int s_q : {2, 3, 4}) {
    for (const Scenario& scenario : scenarios()) {
      testkit::DecodeCaseOptions o = small_case(heads, s_q);
      o.seed = ++seed;
      expect_packed_matches(o, scenario, "h " + std::to_string(heads) + " s_q " + std::to_string(s_q));
    }
  }
}

TEST(CudaPackedDecode, OneHead) {
  SKIP_WITHOUT_DEVICE();
  run_matrix(1);
}
TEST(CudaPackedDecode, ThreeHeads) {
  SKIP_WITHOUT_DEVICE();
  run_matrix(3);
}
TEST(CudaPackedDecode, EightHeads) {
  SKIP_WITHOUT_DEVICE();
  run_matrix(8);
}
TEST(CudaPackedDecode, SixteenHeads) {
  SKIP_WITHOUT_DEVICE();
  run_matrix(16);
}
TEST(CudaPackedDecode, ThirtyTwoHeads) {
  SKIP_WITHOUT_DEVICE();
  run_matrix(32);
}

// Enough request groups to fill the device: nothing is split.
TEST(CudaPackedDecode, ManyRequestsUnsplit) {
  SKIP_WITHOUT_DEVICE();
  for (const Scenario& scenario : {scenarios()[0], scenarios()[3], scenarios()[4]}) {
    testkit::DecodeCaseOptions o = small_case(4, 2);
    o.num_requests = 320;
    o.main_topk = 32;
    o.main_context = 40;
    o.extra_topk = 32;
    o.extra_context = 48;
    o.random_lengths = true;
    expect_packed_matches(o, scenario, "320 requests h 4");
  }
}

// Strided views, the V3.2 format without an extra cache, and s_q = 8 (at h 16
// the plain rule packs 4 of the 8 tokens into 64 rows, or 2 into 32).
TEST(CudaPackedDecode, StridedV32AndPartialGroups) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_case(16, 8);
  o.strided = true;
  o.random_lengths = true;
  expect_packed_matches(o, scenarios()[0], "strided s_q 8");
  o = small_case(5, 2);
  o.format = KvFormat::kV32Fp8;
  o.extra_topk = 0;
  o.main_topk = 200;
  o.main_context = 260;
  expect_packed_matches(o, scenarios()[3], "v3.2 h 5");
}

// Plain fp8 rows keep each source's own per-tensor scale: main only, and an
// extra cache read with twice the main cache's scale.
TEST(CudaPackedDecode, Fp8RowsKeepEachSourcesScale) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_case(8, 2);
  o.format = KvFormat::kFp8Rows;
  o.extra_topk = 0;
  expect_packed_matches(o, scenarios()[0], "fp8 rows main only");
  o = small_case(8, 4);
  o.format = KvFormat::kFp8Rows;
  Scenario scaled = scenarios()[0];
  scaled.extra_fp8_scale_factor = 2.0f;
  expect_packed_matches(o, scaled, "fp8 rows, extra scale x2");
}

// Graph capture with the explicit workspace: the prepass reads lengths on the
// device, so a replay follows new length values.
TEST(CudaPackedDecode, GraphReplayFollowsNewLengths) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = small_case(8, 4);
  o.seed = testing::test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::DecodeCase c = testkit::make_decode_case(o);
  cudatest::expect_graph_replay_follows_new_lengths(c, o.s_q, [](SparseDecodeArgs& host) {
    for (std::int64_t t = 0; t < host.q.shape[0]; ++t) {
      *host.main_lengths.ptr_at<std::int32_t>({t}) /= 2 + t % 2;
      *host.extra_lengths.ptr_at<std::int32_t>({t}) /= 2;
    }
  });
}

// Host-only: how many tokens the plan packs, against values worked out by hand.
TEST(PackPlan, TokensPerCta) {
  using cuda::choose_pack_tokens;
  using cuda::PackRule;
  constexpr std::int64_t kV4Keys = 128 + 512;
  // Tuned: pack while the tile rows per token shrink (ties: more tokens).
  EXPECT_EQ(choose_pack_tokens(8, kV4Keys, 2), 2);   // one 16-row tile instead of two half-empty ones
  EXPECT_EQ(choose_pack_tokens(8, kV4Keys, 4), 4);   // 32 rows for 4 tokens: 8 rows each, as with 2
  EXPECT_EQ(choose_pack_tokens(16, kV4Keys, 4), 1);  // 16-row tiles are full already
  EXPECT_EQ(choose_pack_tokens(32, kV4Keys, 2), 1);
  EXPECT_EQ(choose_pack_tokens(3, kV4Keys, 4), 4);   // 12 rows on one 16-row tile
  EXPECT_EQ(choose_pack_tokens(12, kV4Keys, 2), 1);  // 24 rows need a 32-row tile: no saving
  EXPECT_EQ(choose_pack_tokens(1, kV4Keys, 16), 4);  // 8 x 640 entries exceed the prepass's 4096
  EXPECT_EQ(choose_pack_tokens(8, kV4Keys, 3), 3);   // 24 of 32 rows: 10.7 per token
  EXPECT_EQ(choose_pack_tokens(8, kV4Keys, 1), 1);
  // Plain rule: the largest divisor of s_q within the rows.
  EXPECT_EQ(choose_pack_tokens(16, kV4Keys, 4, PackRule{64, false}), 4);
  EXPECT_EQ(choose_pack_tokens(16, kV4Keys, 4, PackRule{32, false}), 2);
  EXPECT_EQ(choose_pack_tokens(32, kV4Keys, 3, PackRule{64, false}), 1);  // 2 does not divide 3
  EXPECT_EQ(choose_pack_tokens(16, kV4Keys, 6, PackRule{64, false}), 3);
  EXPECT_EQ(choose_pack_tokens(8, 2048, 4, PackRule{64, false}), 2);  // V3.2: 2 x 2048 entries at most
  EXPECT_EQ(choose_pack_tokens(64, kV4Keys, 2, PackRule{64, false}), 1);
  EXPECT_EQ(choose_pack_tokens(4, kV4Keys, 4, PackRule{0, false}), 1);  // packing off
}

// Host-only: the hint is validated by every backend.
TEST(QueriesPerRequestValidation, ZeroIsRejected) {
  testkit::DecodeCase c = testkit::make_decode_case(small_case(4, 2));
  SparseDecodeArgs args = c.args();
  args.queries_per_request = 0;
  EXPECT_TRUE(FailsWith(sparse_decode(args, Backend::kReference), StatusCode::kInvalidArgument,
                        {"queries_per_request", ">= 1", "0"}));
}

TEST(QueriesPerRequestValidation, MustDivideTokens) {
  testkit::DecodeCase c = testkit::make_decode_case(small_case(4, 2));  // T = 4
  SparseDecodeArgs args = c.args();
  args.queries_per_request = 3;
  EXPECT_TRUE(FailsWith(sparse_decode(args, Backend::kReference), StatusCode::kInvalidArgument,
                        {"queries_per_request", "divisor of T = 4", "3"}));
  args.queries_per_request = 4;  // the whole batch as one request is valid
  EXPECT_TRUE(IsOk(sparse_decode(args, Backend::kReference)));
}

}  // namespace
}  // namespace smla
