// Non-finite values and overflow on the cuda backend (docs/attention.md): the
// table of tests/unit/consistency/nonfinite_cases.h, each case compared with the
// float64 reference (NaN and +-inf positions identical, finite values within the
// CUDA tolerances), over launches that reach every path of the semantics:
//   * decode split over keys (per-split sums and maxima merged by split_combine.cu)
//     and unsplit (the kernel's own epilogue), h 64 (a 64-row tile: the sm90
//     kernel where usable), h 100 (sm90 CTA pairs), h 16 (portable 16-row tile);
//   * packed MTP (h 8, s_q 2: the pack prepass and the portable kernel);
//   * flat bf16 prefill, split and unsplit (max_logits too);
// and on every cuda implementation in the registry that runs on this device
// (cuda.sm90, also with CTA pairs forced and without them for h > 64, and cuda.portable).
// The reference is also held to the semantics table (check_semantics).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tests/common/test_common.h"
#include "tests/unit/consistency/nonfinite_cases.h"
#include "tests/unit/cuda/attention_expect.h"
#include "testkit/cuda/device_copy.h"

namespace smla {
namespace {

using cudatest::copy_to_host;
using cudatest::DeviceDecodeArgs;
using cudatest::DevicePrefillArgs;
using nonfinite::Case;
using nonfinite::CaseSpec;
using nonfinite::Outputs;
using nonfinite::Shape;

// The CUDA attention tests' tolerances (attention_expect.h): bf16 K, P and output.
const nonfinite::Tolerances kCudaTolerances{cudatest::kOutTolerance, cudatest::kStatTolerance};

enum class Split { kYes, kNo, kAny };

struct Launch {
  std::string name;
  Shape shape;
  Split split;
};

int sm_count() {
  int device = 0;
  int count = 0;
  cudatest::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  cudatest::check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "sm count");
  return count;
}

// Enough tokens that 64-row tiles (one CTA per SM) fill every SM: no split.
std::int64_t unsplit_requests(int s_q) { return (sm_count() + 2 + s_q - 1) / s_q; }

std::vector<Launch> launches(nonfinite::Op op) {
  if (op == nonfinite::Op::kPrefill) {
    return {{"prefill split, h 64", Shape{1, 4, 64}, Split::kYes},
            {"prefill unsplit, h 64", Shape{unsplit_requests(1), 1, 64}, Split::kNo},
            {"prefill split, h 16", Shape{1, 4, 16}, Split::kYes}};
  }
  return {{"decode split, h 64", Shape{1, 2, 64}, Split::kYes},
          {"decode unsplit, h 64", Shape{unsplit_requests(2), 2, 64}, Split::kNo},
          {"decode split, h 100 (sm90 CTA pairs)", Shape{1, 2, 100}, Split::kYes},
          {"decode split, h 16", Shape{1, 2, 16}, Split::kYes},
          {"decode packed, h 8 s_q 2", Shape{2, 2, 8, /*pack=*/true}, Split::kAny}};
}

// The workspace the plan asks for: non-zero exactly when the keys are split (or packed).
std::size_t workspace_bytes(const Context& context, Case& c, const Outputs& outputs) {
  if (c.op == nonfinite::Op::kDecode) {
    DeviceDecodeArgs device(nonfinite::decode_args(c, outputs));
    auto bytes = sparse_decode_workspace_size(context, device.args);
    return bytes.ok() ? *bytes : 0;
  }
  DevicePrefillArgs device(nonfinite::prefill_args(c, outputs));
  auto bytes = sparse_prefill_workspace_size(context, device.args);
  return bytes.ok() ? *bytes : 0;
}

// One cuda run of the case into fresh sentinel-filled outputs.
::testing::AssertionResult run_cuda(const Context& context, Case& c, Outputs* got) {
  *got = nonfinite::make_outputs(c);
  Status status;
  if (c.op == nonfinite::Op::kDecode) {
    DeviceDecodeArgs device(nonfinite::decode_args(c, *got));
    status = sparse_decode(context, device.args);
    if (cudaDeviceSynchronize() != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed";
    copy_to_host(*device.out, got->out.view());
    copy_to_host(*device.lse, got->lse.view());
  } else {
    DevicePrefillArgs device(nonfinite::prefill_args(c, *got));
    status = sparse_prefill(context, device.args);
    if (cudaDeviceSynchronize() != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed";
    copy_to_host(*device.out, got->out.view());
    copy_to_host(*device.max_logits, got->max_logits.view());
    copy_to_host(*device.lse, got->lse.view());
  }
  return testing::IsOk(status);
}

class CudaNonfinite : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaNonfinite, MatchesTheReferenceOnEveryPath) {
  SKIP_WITHOUT_DEVICE();
  const CaseSpec& spec = GetParam();
  const std::uint64_t seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  for (const Launch& launch : launches(spec.op)) {
    // A packed group reads a row for all its tokens: only cases whose NaN rows
    // every token of the group selects keep the unpacked results (docs/cuda_backend.md).
    if (launch.shape.pack && !spec.packable) continue;
    Case c = spec.build(launch.shape, seed);
    SCOPED_TRACE(c.name + " | " + launch.name + " (" + launch.shape.name() + ")");
    Outputs want;
    ASSERT_TRUE(testing::IsOk(nonfinite::run_host(c, Backend::kReference, &want)));
    const std::string semantics = nonfinite::check_semantics(c, want);
    EXPECT_TRUE(semantics.empty()) << "reference against the semantics table:\n" << semantics;

    const Op op = spec.op == nonfinite::Op::kDecode ? Op::kSparseDecode : Op::kSparsePrefill;
    for (const cudatest::KernelChoice& choice : cudatest::kernel_choices(op, launch.shape.num_heads)) {
      SCOPED_TRACE(choice.label);
      const Context context = cudatest::cuda_context(choice.tuning);
      // Staged rows take workspace of their own, split or not: the check reads the unstaged plan.
      if (launch.split != Split::kAny && choice.tuning.sm90_stage_rows != TuningOptions::Switch::kOn) {
        TuningOptions unordered = choice.tuning;  // the token order takes workspace of its own, split or not
        unordered.sm90_length_order = TuningOptions::Switch::kOff;
        const std::size_t bytes = workspace_bytes(cudatest::cuda_context(unordered), c, want);
        EXPECT_EQ(bytes > 0, launch.split == Split::kYes)
            << "the launch was meant to be " << (launch.split == Split::kYes ? "split" : "unsplit")
            << " (workspace " << bytes << " B): the plan changed, adjust the shapes";
      }
      Outputs got;
      ASSERT_TRUE(run_cuda(context, c, &got));
      const std::string mismatch = nonfinite::compare(c, got, want, kCudaTolerances);
      EXPECT_TRUE(mismatch.empty()) << mismatch;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CudaNonfinite, ::testing::ValuesIn(nonfinite::cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& param) { return std::string(param.param.name); });

}  // namespace
}  // namespace smla
