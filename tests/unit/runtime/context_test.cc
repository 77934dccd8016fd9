// Context: backend resolution, scratch from the caller's workspace or the owned
// buffer, and tuning read from the environment once, with clear errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "smla/context.h"
#include "tests/common/test_common.h"

namespace smla {
namespace {

using testing::FailsWith;
using testing::IsOk;

// Sets an environment variable for one scope.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedVariable() { ::unsetenv(name_); }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
};

TEST(Context, HostBackendsHaveTheHostDevice) {
  for (Backend backend : {Backend::kReference, Backend::kCpu}) {
    auto context = Context::create(backend);
    ASSERT_TRUE(IsOk(context.status()));
    EXPECT_EQ(context->backend(), backend);
    EXPECT_EQ(context->device().ordinal, -1);
    EXPECT_EQ(context->device().compute_capability, 0);
    EXPECT_EQ(context->device().name, "host");
  }
  auto automatic = Context::create(Backend::kAuto);
  ASSERT_TRUE(IsOk(automatic.status()));
  EXPECT_NE(automatic->backend(), Backend::kAuto);
}

TEST(Context, CudaWithoutADeviceIsUnimplemented) {
  if (backend_available(Backend::kCuda)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_TRUE(FailsWith(Context::create(Backend::kCuda).status(), StatusCode::kUnimplemented, {"cuda"}));
}

TEST(Context, ScratchComesFromTheCallersWorkspace) {
  auto context = Context::create(Backend::kCpu);
  ASSERT_TRUE(IsOk(context.status()));
  alignas(256) static std::uint8_t buffer[1024];
  context->set_workspace(buffer, sizeof(buffer));
  auto scratch = context->scratch(1024);
  ASSERT_TRUE(IsOk(scratch.status()));
  EXPECT_EQ(*scratch, buffer);
  EXPECT_TRUE(FailsWith(context->scratch(1025).status(), StatusCode::kInvalidArgument,
                        {"workspace", "at least 1025 bytes", "1024 bytes"}));
  context->set_workspace(buffer + 16, 512);
  EXPECT_TRUE(FailsWith(context->scratch(64).status(), StatusCode::kInvalidArgument, {"workspace", "256-byte aligned"}));
  auto none = context->scratch(0);
  ASSERT_TRUE(IsOk(none.status()));
  EXPECT_EQ(*none, nullptr);
  // A caller workspace of 0 bytes still means "never allocate": the op is told the size it needs.
  context->set_workspace(nullptr, 0);
  EXPECT_TRUE(FailsWith(context->scratch(64).status(), StatusCode::kInvalidArgument, {"workspace", "at least 64"}));
  context->use_owned_workspace();
  EXPECT_FALSE(context->has_caller_workspace());
  EXPECT_TRUE(IsOk(context->scratch(64).status()));
}

TEST(Context, OwnedScratchGrowsAndIsSharedByCopies) {
  auto context = Context::create(Backend::kCpu);
  ASSERT_TRUE(IsOk(context.status()));
  auto small = context->scratch(256);
  ASSERT_TRUE(IsOk(small.status()));
  ASSERT_NE(*small, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*small) % 256, 0u);
  const Context copy = *context;
  auto again = copy.scratch(128);  // fits the buffer the original grew
  ASSERT_TRUE(IsOk(again.status()));
  EXPECT_EQ(*again, *small);
  auto large = copy.scratch(1 << 20);
  ASSERT_TRUE(IsOk(large.status()));
  static_cast<std::uint8_t*>(*large)[(1 << 20) - 1] = 1;  // the whole size is usable (ASan checks)
}

TEST(TuningOptions, DefaultsAreTheTunedChoices) {
  const TuningOptions defaults;
  EXPECT_EQ(defaults.implementation, "");
  EXPECT_EQ(defaults.pack_max_rows, -1);
  EXPECT_EQ(defaults.sm90_prefetch, TuningOptions::Switch::kAuto);
  EXPECT_TRUE(defaults.sm90_pair_head_blocks);
  EXPECT_TRUE(defaults.sm90_token_major);
  EXPECT_EQ(defaults.sm90_stage_rows, TuningOptions::Switch::kAuto);
  EXPECT_EQ(defaults.sm90_length_order, TuningOptions::Switch::kAuto);
  EXPECT_EQ(defaults.sm90_tensor_stores, TuningOptions::Switch::kAuto);
  EXPECT_EQ(defaults.sm90_staging_rows, -1);
  EXPECT_EQ(defaults.sm90_persistent_ctas, -1);
  EXPECT_EQ(defaults.sm90_head_block_rows, 0);
  EXPECT_EQ(defaults.sm90_output_box_rows, 0);
  EXPECT_EQ(defaults.sm90_fold_splits, TuningOptions::Switch::kAuto);
  EXPECT_EQ(defaults.cpu_threads, 0);
}

TEST(TuningOptions, ReadFromTheEnvironment) {
  const ScopedVariable implementation("SMLA_IMPLEMENTATION", "cuda.portable");
  const ScopedVariable pack("SMLA_CUDA_PACK_MAX_ROWS", "64");
  const ScopedVariable prefetch("SMLA_SM90_PREFETCH", "off");
  const ScopedVariable pair("SMLA_SM90_PAIR", "off");
  const ScopedVariable order("SMLA_SM90_BLOCK_ORDER", "grid");
  const ScopedVariable threads("SMLA_NUM_THREADS", "3");
  const ScopedVariable stage("SMLA_SM90_STAGE", "on");
  const ScopedVariable staging_rows("SMLA_SM90_STAGING_ROWS", "5000");
  const ScopedVariable persistent("SMLA_SM90_PERSISTENT_CTAS", "7");
  const ScopedVariable head_rows("SMLA_SM90_HEAD_ROWS", "32");
  const ScopedVariable length_order("SMLA_SM90_LENGTH_ORDER", "off");
  const ScopedVariable tensor_stores("SMLA_SM90_TENSOR_STORES", "on");
  const ScopedVariable box_rows("SMLA_SM90_OUTPUT_BOX_ROWS", "64");
  const ScopedVariable fold("SMLA_SM90_FOLD_SPLITS", "off");
  auto tuning = TuningOptions::from_environment();
  ASSERT_TRUE(IsOk(tuning.status()));
  EXPECT_EQ(tuning->implementation, "cuda.portable");
  EXPECT_EQ(tuning->pack_max_rows, 64);
  EXPECT_EQ(tuning->sm90_prefetch, TuningOptions::Switch::kOff);
  EXPECT_FALSE(tuning->sm90_pair_head_blocks);
  EXPECT_FALSE(tuning->sm90_token_major);
  EXPECT_EQ(tuning->cpu_threads, 3);
  EXPECT_EQ(tuning->sm90_stage_rows, TuningOptions::Switch::kOn);
  EXPECT_EQ(tuning->sm90_staging_rows, 5000);
  EXPECT_EQ(tuning->sm90_persistent_ctas, 7);
  EXPECT_EQ(tuning->sm90_head_block_rows, 32);
  EXPECT_EQ(tuning->sm90_length_order, TuningOptions::Switch::kOff);
  EXPECT_EQ(tuning->sm90_tensor_stores, TuningOptions::Switch::kOn);
  EXPECT_EQ(tuning->sm90_output_box_rows, 64);
  EXPECT_EQ(tuning->sm90_fold_splits, TuningOptions::Switch::kOff);
  const ScopedVariable one_per_block("SMLA_SM90_PERSISTENT_CTAS", "0");
  auto zero = TuningOptions::from_environment();
  ASSERT_TRUE(IsOk(zero.status()));
  EXPECT_EQ(zero->sm90_persistent_ctas, 0);
}

TEST(TuningOptions, UnknownValuesNameTheVariable) {
  {
    const ScopedVariable pack("SMLA_CUDA_PACK_MAX_ROWS", "17");
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_CUDA_PACK_MAX_ROWS", "0, 16, 32 or 64", "'17'"}));
    EXPECT_TRUE(FailsWith(Context::create(Backend::kCpu).status(), StatusCode::kInvalidArgument,
                          {"SMLA_CUDA_PACK_MAX_ROWS"}));
  }
  for (const char* threads : {"0", "-2", "two", "3 ", "+3", "99999999999"}) {
    const ScopedVariable count("SMLA_NUM_THREADS", threads);
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_NUM_THREADS", "a positive integer", std::string("'") + threads + "'"}))
        << threads;
  }
  for (const char* rows : {"0", "-1", "many"}) {
    const ScopedVariable staging_rows("SMLA_SM90_STAGING_ROWS", rows);
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_STAGING_ROWS", "a positive integer", std::string("'") + rows + "'"}))
        << rows;
  }
  for (const char* ctas : {"-1", "00", "all"}) {
    const ScopedVariable persistent("SMLA_SM90_PERSISTENT_CTAS", ctas);
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_PERSISTENT_CTAS", "0 or a positive integer", std::string("'") + ctas + "'"}))
        << ctas;
  }
  for (const char* rows : {"0", "8", "48", "sixteen"}) {
    const ScopedVariable head_rows("SMLA_SM90_HEAD_ROWS", rows);
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_HEAD_ROWS", "16, 32 or 64", std::string("'") + rows + "'"}))
        << rows;
  }
  for (const char* rows : {"0", "32", "128", "warp"}) {
    const ScopedVariable box_rows("SMLA_SM90_OUTPUT_BOX_ROWS", rows);
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_OUTPUT_BOX_ROWS", "16 or 64", std::string("'") + rows + "'"}))
        << rows;
  }
  {
    const ScopedVariable stage("SMLA_SM90_STAGE", "sometimes");
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_STAGE", "on, off or auto", "'sometimes'"}));
  }
  {
    const ScopedVariable tensor_stores("SMLA_SM90_TENSOR_STORES", "tma");
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_TENSOR_STORES", "on, off or auto", "'tma'"}));
  }
  {
    const ScopedVariable fold("SMLA_SM90_FOLD_SPLITS", "cluster");
    EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                          {"SMLA_SM90_FOLD_SPLITS", "on, off or auto", "'cluster'"}));
  }
  const ScopedVariable pair("SMLA_SM90_PAIR", "maybe");
  EXPECT_TRUE(FailsWith(TuningOptions::from_environment().status(), StatusCode::kInvalidArgument,
                        {"SMLA_SM90_PAIR", "on, off or auto", "'maybe'"}));
}

}  // namespace
}  // namespace smla
