// Shared checks of the CUDA attention tests: run the float64 reference on a
// host testkit case and every cuda implementation in the registry that runs on
// this device (selected by name through TuningOptions) on a device copy
// (outputs poisoned on both sides), then compare every element within bf16
// tolerances.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <iostream>
#include <string>
#include <vector>

#include "smla/attention.h"
#include "smla/context.h"
#include "smla/registry.h"
#include "tests/common/test_common.h"
#include "testkit/cuda/device_copy.h"
#include "testkit/testkit.h"

// First line of every GPU test: skips, visibly, on a machine without a CUDA device.
#define SKIP_WITHOUT_DEVICE()                                                          \
  do {                                                                                 \
    if (!::smla::cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device";     \
  } while (0)

namespace smla::cudatest {

// bf16 inputs and P, f32 accumulation, bf16 output: about 1e-2 of |v| ~ 1.
inline const testkit::Tolerance kOutTolerance{2e-2, 2e-2, 1e-4};
inline const testkit::Tolerance kStatTolerance{2e-3, 1e-4, 1e-6};

// A cuda context with these tuning options on the current device.
inline Context cuda_context(const TuningOptions& tuning = {}) {
  auto context = Context::create(Backend::kCuda, tuning);
  EXPECT_TRUE(testing::IsOk(context.status()));
  if (!context) throw std::runtime_error(context.status().to_string());
  return *context;
}

struct KernelChoice {
  std::string label;
  TuningOptions tuning;
};

// cuda.sm90 (`tuning` otherwise, named `what`) with the kernel of copied rows on at
// most `ctas` CTAs, each running several (token, head block, split) blocks in turn.
inline KernelChoice sm90_on_persistent_ctas(int ctas, TuningOptions tuning = {}, const std::string& what = "cuda.sm90") {
  tuning.implementation = "cuda.sm90";
  tuning.sm90_persistent_ctas = ctas;
  return {what + ", copied rows on " + std::to_string(ctas) + " persistent CTAs", tuning};
}

// Every cuda implementation of `op` that runs on this device, named through
// TuningOptions::implementation (the registry, not a hard-coded list); the sm90
// kernel also with CTA pairs forced and without them when a token has two 64-row head blocks, with FP8
// rows staged (decode), without the L2 row prefetch (decode) and with copied rows
// on three CTAs (the staged decode choice, and prefill, there with and without the
// output's tensor stores, on by default, and with their 64-row boxes), so the test
// grids, a CTA per block by default, also run blocks one after another in a CTA.
inline std::vector<KernelChoice> kernel_choices(Op op, std::int64_t heads) {
  std::vector<KernelChoice> choices;
  const Context context = cuda_context();
  for (const Implementation& implementation : implementations()) {
    if (implementation.op != op || implementation.backend != Backend::kCuda) continue;
    Problem probe;
    probe.op = op;
    const std::string reason = unsupported_reason(implementation, context, probe);
    if (!reason.empty()) {
      std::cout << "[ NOTE ] " << implementation.name << " does not run here: " << reason << "\n";
      continue;
    }
    TuningOptions tuning;
    tuning.implementation = std::string(implementation.name);
    choices.push_back({tuning.implementation, tuning});
    if (implementation.name != "cuda.sm90") continue;
    if (op == Op::kSparseDecode) {  // V4 / V3.2 rows staged as bf16 (other formats run as they are)
      TuningOptions staged = tuning;
      staged.sm90_stage_rows = TuningOptions::Switch::kOn;
      choices.push_back(sm90_on_persistent_ctas(3, staged, "cuda.sm90 with FP8 rows staged"));
      staged.sm90_tensor_stores = TuningOptions::Switch::kOff;  // the copying kernel's outputs staged in the Q tile
      choices.push_back(
          sm90_on_persistent_ctas(3, staged, "cuda.sm90 with FP8 rows staged, output through the Q tile"));
      // The test cases' CTAs are few keys each, which the plan prefetches into L2; without
      // it the FP8 producer runs its other loop (unrolled for unpaired d_qk 512).
      // With the token order prepass forced too: the grid runs the tokens longest first.
      TuningOptions no_prefetch = tuning;
      no_prefetch.sm90_prefetch = TuningOptions::Switch::kOff;
      no_prefetch.sm90_length_order = TuningOptions::Switch::kOn;
      choices.push_back({"cuda.sm90 without the L2 row prefetch, tokens longest first", no_prefetch});
      // FP8 rows in blocks of 16 heads (a choice of the plan for split small batches), unpaired.
      TuningOptions small_blocks = tuning;
      small_blocks.sm90_head_block_rows = 16;
      choices.push_back({"cuda.sm90 with 16-head blocks", small_blocks});
      // Split launches of FP8 rows that the plan folds by default (the splits of a block
      // merged in their cluster, TuningOptions::sm90_fold_splits) merged by the combine
      // kernel instead.
      TuningOptions combined = tuning;
      combined.sm90_fold_splits = TuningOptions::Switch::kOff;
      choices.push_back({"cuda.sm90 with splits merged by the combine kernel", combined});
    } else {
      choices.push_back(sm90_on_persistent_ctas(3));
      // The copying kernel's outputs staged through the Q tile (by default, d 512 rows'
      // unsplit aligned outputs leave by per-warp tensor stores).
      TuningOptions staged_output = tuning;
      staged_output.sm90_tensor_stores = TuningOptions::Switch::kOff;
      choices.push_back(sm90_on_persistent_ctas(3, staged_output, "cuda.sm90 with the output through the Q tile"));
      // ... or by tensor stores of a warpgroup's 64 rows at a time.
      TuningOptions box64 = tuning;
      box64.sm90_output_box_rows = 64;
      choices.push_back(sm90_on_persistent_ctas(3, box64, "cuda.sm90 with 64-row output boxes"));
    }
    if (heads > 64 && heads <= 128) {
      // The plan leaves short splits unpaired; forced 64-head blocks keep the pairs there.
      TuningOptions paired = tuning;
      paired.sm90_head_block_rows = 64;
      choices.push_back({"cuda.sm90 with CTA pairs", paired});
      tuning.sm90_pair_head_blocks = false;
      choices.push_back({"cuda.sm90 without CTA pairs", tuning});
    }
  }
  return choices;
}

// Whether the registry's cuda.sm90 row runs on this device.
inline bool sm90_kernel_runs() {
  for (const KernelChoice& choice : kernel_choices(Op::kSparseDecode, 64)) {
    if (choice.tuning.implementation == "cuda.sm90") return true;
  }
  return false;
}

// The output tensor of case `c`, or one whose rows are `head_stride` values apart
// (0: the case's own strides), e.g. not a multiple of 8 so rows miss 16 bytes.
inline testkit::HostTensor output_like(const testkit::DecodeCase& c, std::int64_t head_stride) {
  if (head_stride == 0) return c.make_out();
  const TensorView& v = c.out().view();
  return testkit::HostTensor::zeros(DType::kBF16, {v.shape[0], v.shape[1], v.shape[2]},
                                    {v.shape[1] * head_stride, head_stride, 1});
}

// Runs case `options` on each of `choices` (default: kernel_choices) against the reference.
inline void expect_decode_matches(testkit::DecodeCaseOptions options, const std::string& what,
                                  std::int64_t out_head_stride = 0, std::vector<KernelChoice> choices = {}) {
  if (choices.empty()) choices = kernel_choices(Op::kSparseDecode, options.num_heads);
  options.seed = testing::test_seed() + options.seed;
  SMLA_SEED_TRACE(options.seed);
  SCOPED_TRACE(what);
  testkit::DecodeCase c = testkit::make_decode_case(options);
  ASSERT_TRUE(testing::IsOk(sparse_decode(c.args(), Backend::kReference)));
  for (const KernelChoice& choice : choices) {
    SCOPED_TRACE(choice.label);
    testkit::HostTensor got_out = output_like(c, out_head_stride);
    testkit::HostTensor got_lse = c.make_lse();
    testkit::poison(got_out.view());
    testkit::poison(got_lse.view());
    DeviceDecodeArgs device(c.args_with_outputs(got_out.view(), got_lse.view()));
    ASSERT_TRUE(testing::IsOk(sparse_decode(cuda_context(choice.tuning), device.args)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    copy_to_host(*device.out, got_out.view());
    copy_to_host(*device.lse, got_lse.view());
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_bf16(got_out.view(), c.out().view(), kOutTolerance), "out"));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_f32(got_lse.view(), c.lse().view(), kStatTolerance), "lse"));
  }
}

inline void expect_prefill_matches(testkit::PrefillCaseOptions options, const std::string& what,
                                   std::vector<KernelChoice> choices = {}) {
  if (choices.empty()) choices = kernel_choices(Op::kSparsePrefill, options.num_heads);
  options.seed = testing::test_seed() + options.seed;
  SMLA_SEED_TRACE(options.seed);
  SCOPED_TRACE(what);
  testkit::PrefillCase c = testkit::make_prefill_case(options);
  ASSERT_TRUE(testing::IsOk(sparse_prefill(c.args(), Backend::kReference)));
  for (const KernelChoice& choice : choices) {
    SCOPED_TRACE(choice.label);
    testkit::HostTensor got_out = c.make_out();
    testkit::HostTensor got_max = c.make_max_logits();
    testkit::HostTensor got_lse = c.make_lse();
    testkit::poison(got_out.view());
    testkit::poison(got_max.view());
    testkit::poison(got_lse.view());
    DevicePrefillArgs device(c.args_with_outputs(got_out.view(), got_max.view(), got_lse.view()));
    ASSERT_TRUE(testing::IsOk(sparse_prefill(cuda_context(choice.tuning), device.args)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    copy_to_host(*device.out, got_out.view());
    copy_to_host(*device.max_logits, got_max.view());
    copy_to_host(*device.lse, got_lse.view());
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_bf16(got_out.view(), c.out().view(), kOutTolerance), "out"));
    EXPECT_TRUE(
        testing::WithinTolerance(testkit::compare_f32(got_max.view(), c.max_logits().view(), kStatTolerance), "max"));
    EXPECT_TRUE(testing::WithinTolerance(testkit::compare_f32(got_lse.view(), c.lse().view(), kStatTolerance), "lse"));
  }
}

// Halves every token's main and extra length (a shrink_lengths for the replay check below).
inline void halve_lengths(SparseDecodeArgs& host) {
  for (std::int64_t t = 0; t < host.q.shape[0]; ++t) {
    *host.main_lengths.ptr_at<std::int32_t>({t}) /= 2;
    *host.extra_lengths.ptr_at<std::int32_t>({t}) /= 2;
  }
}

// Captures one sparse_decode (cuda) of case `c` (with `queries_per_request`) in a
// CUDA graph, changes the length VALUES on the device with `shrink_lengths`
// (applied to the host arguments; keep the new lengths inside the old ones:
// rows past them may hold NaN poison), replays the graph and compares with the
// reference on the new lengths. Nothing was planned from the values on the host,
// so the replay must follow them.
inline void expect_graph_replay_follows_new_lengths(testkit::DecodeCase& c, std::int64_t queries_per_request,
                                                    const std::function<void(SparseDecodeArgs&)>& shrink_lengths,
                                                    const TuningOptions& tuning = {}) {
  testkit::HostTensor got_out = c.make_out();
  testkit::HostTensor got_lse = c.make_lse();
  SparseDecodeArgs captured_args = c.args_with_outputs(got_out.view(), got_lse.view());
  captured_args.queries_per_request = queries_per_request;
  DeviceDecodeArgs device(captured_args);
  Context context = cuda_context(tuning);
  auto plan = plan_sparse_decode(context, device.args);
  ASSERT_TRUE(testing::IsOk(plan.status()));
  DeviceBuffer workspace(plan->workspace_bytes());
  context.set_workspace(workspace.data(), plan->workspace_bytes());

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  context.set_stream(stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status captured = sparse_decode(context, *plan, device.args);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(testing::IsOk(captured));
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  SparseDecodeArgs host = c.args();
  shrink_lengths(host);
  check_cuda(cudaMemcpy(device.args.main_lengths.data, host.main_lengths.data, testkit::storage_bytes(host.main_lengths),
                        cudaMemcpyHostToDevice),
             "lengths");
  check_cuda(cudaMemcpy(device.args.extra_lengths.data, host.extra_lengths.data,
                        testkit::storage_bytes(host.extra_lengths), cudaMemcpyHostToDevice),
             "lengths");
  ASSERT_TRUE(testing::IsOk(sparse_decode(host, Backend::kReference)));
  testkit::poison(got_out.view());
  check_cuda(cudaMemcpy(device.args.out.data, got_out.view().data, testkit::storage_bytes(got_out.view()),
                        cudaMemcpyHostToDevice),
             "poison");
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  copy_to_host(*device.out, got_out.view());
  copy_to_host(*device.lse, got_lse.view());
  EXPECT_TRUE(testing::WithinTolerance(testkit::compare_bf16(got_out.view(), c.out().view(), kOutTolerance), "out"));
  EXPECT_TRUE(testing::WithinTolerance(testkit::compare_f32(got_lse.view(), c.lse().view(), kStatTolerance), "lse"));
}

}  // namespace smla::cudatest
