// smla replay reproduces a call written with write_replay_case, byte for byte.
#include "tools/smla/replay.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "smla/numeric.h"
#include "tests/common/test_common.h"
#include "tests/unit/tools/scoped_dir.h"
#include "testkit/testkit.h"
#include "tools/smla/npy.h"

namespace smla::cli {
namespace {

using smla::testing::IsOk;

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

nlohmann::json manifest_of(const ScopedDir& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}

void write_expected(const std::filesystem::path& path, const TensorView& view) {
  auto array = npy_from_tensor(view, path.string());
  ASSERT_TRUE(array.ok()) << array.status().to_string();
  ASSERT_TRUE(write_npy(path, *array).ok());
}

testkit::DecodeCaseOptions small_decode(KvFormat format, std::uint64_t seed) {
  testkit::DecodeCaseOptions options;
  options.format = format;
  options.num_requests = 2;
  options.s_q = 2;
  options.num_heads = 3;
  options.main_topk = 16;
  options.main_page_size = 5;  // odd page sizes
  options.main_context = 40;
  options.extra_topk = format == KvFormat::kV32Fp8 ? 0 : 12;
  options.extra_page_size = 3;
  options.extra_context = 20;
  options.random_lengths = true;
  options.seed = seed;
  return options;
}

class DecodeReplay : public ::testing::TestWithParam<std::tuple<KvFormat, bool>> {};

TEST_P(DecodeReplay, ReproducesTheReferenceOutputByteForByte) {
  const auto [format, strided] = GetParam();
  const std::uint64_t seed = smla::testing::test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::DecodeCaseOptions options = small_decode(format, seed);
  options.strided = strided;  // padded q/index strides and padded cache pages
  testkit::DecodeCase batch = testkit::make_decode_case(options);

  // The expected output, computed in memory by the reference on the original (possibly strided) views.
  testkit::HostTensor want_out = batch.make_out();
  testkit::HostTensor want_lse = batch.make_lse();
  ASSERT_TRUE(IsOk(sparse_decode(batch.args_with_outputs(want_out.view(), want_lse.view()), Backend::kReference)));
  ASSERT_TRUE(testkit::all_written(want_out.view()));

  const ScopedDir case_dir("replay_case"), want_dir("replay_want"), out_dir("replay_out");
  ASSERT_TRUE(IsOk(write_replay_case(case_dir.path(), batch.args())));
  write_expected(want_dir / "out.npy", want_out.view());
  write_expected(want_dir / "lse.npy", want_lse.view());
  if (strided) {
    // The testkit pads pages when strided; the manifest must carry the stride so the replay sees it too.
    const nlohmann::json manifest = manifest_of(case_dir);
    EXPECT_TRUE(manifest.contains("main_page_stride_bytes")) << manifest.dump();
  }

  // The same entry point `smla replay` calls.
  auto report = replay_case(case_dir.path(), out_dir.path(), Backend::kReference);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->op, ReplayOp::kSparseDecode);
  EXPECT_EQ(report->written.size(), 2u);
  EXPECT_EQ(file_bytes(out_dir / "out.npy"), file_bytes(want_dir / "out.npy"));
  EXPECT_EQ(file_bytes(out_dir / "lse.npy"), file_bytes(want_dir / "lse.npy"));

  auto checks = check_replay_outputs(out_dir.path(), want_dir.path());
  ASSERT_TRUE(checks.ok()) << checks.status().to_string();
  ASSERT_EQ(checks->size(), 2u);
  for (const OutputCheck& check : *checks) EXPECT_TRUE(check.stats.passed()) << check.file << " " << check.stats.to_string();
}

INSTANTIATE_TEST_SUITE_P(Formats, DecodeReplay,
                         ::testing::Combine(::testing::Values(KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kBf16Rows,
                                                             KvFormat::kFp8Rows),
                                            ::testing::Bool()),
                         [](const auto& param_info) {
                           std::string name(kv_format_name(std::get<0>(param_info.param)));
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name + (std::get<1>(param_info.param) ? "_strided" : "_packed");
                         });

TEST(PrefillReplay, ReproducesTheReferenceOutputByteForByte) {
  const std::uint64_t seed = smla::testing::test_seed();
  SMLA_SEED_TRACE(seed);
  testkit::PrefillCaseOptions options;
  options.s_q = 5;
  options.s_kv = 40;
  options.num_heads = 3;
  options.topk = 16;
  options.strided = true;
  options.seed = seed;
  testkit::PrefillCase batch = testkit::make_prefill_case(options);
  testkit::HostTensor want_out = batch.make_out();
  testkit::HostTensor want_max = batch.make_max_logits();
  testkit::HostTensor want_lse = batch.make_lse();
  ASSERT_TRUE(IsOk(sparse_prefill(batch.args_with_outputs(want_out.view(), want_max.view(), want_lse.view()),
                                  Backend::kReference)));

  const ScopedDir case_dir("prefill_case"), out_dir("prefill_out");
  // with_outputs: the case directory doubles as the --check reference.
  ASSERT_TRUE(IsOk(write_replay_case(case_dir.path(), batch.args_with_outputs(want_out.view(), want_max.view(),
                                                                             want_lse.view()),
                                     /*with_outputs=*/true)));
  auto report = replay_case(case_dir.path(), out_dir.path(), Backend::kReference);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->op, ReplayOp::kSparsePrefill);
  for (const char* file : {"out.npy", "max_logits.npy", "lse.npy"}) {
    EXPECT_EQ(file_bytes(out_dir / file), file_bytes(case_dir / file)) << file;
  }
  auto checks = check_replay_outputs(out_dir.path(), case_dir.path());
  ASSERT_TRUE(checks.ok()) << checks.status().to_string();
  EXPECT_EQ(checks->size(), 3u);
}

TEST(ReplayCheck, FlagsAnOutputBeyondTheTolerance) {
  // out = [1, 2, 4, -8] and lse = [0.5]: hand values, so the rule is tested, not the backend.
  const ScopedDir got("check_got"), want("check_want");
  const std::uint16_t reference[4] = {f32_to_bf16(1.0f), f32_to_bf16(2.0f), f32_to_bf16(4.0f), f32_to_bf16(-8.0f)};
  std::uint16_t output[4] = {reference[0], reference[1], reference[2], reference[3]};
  write_expected(want / "out.npy", TensorView::contiguous(const_cast<std::uint16_t*>(reference), DType::kBF16, {1, 4}));
  const auto check_with = [&](float third) {
    output[2] = f32_to_bf16(third);
    write_expected(got / "out.npy", TensorView::contiguous(output, DType::kBF16, {1, 4}));
    auto checks = check_replay_outputs(got.path(), want.path());
    EXPECT_TRUE(checks.ok()) << checks.status().to_string();
    return checks.ok() && checks->size() == 1 && (*checks)[0].stats.passed();
  };
  // Tolerance 2e-2 * max|want| = 0.16.
  EXPECT_TRUE(check_with(4.0f));
  EXPECT_TRUE(check_with(4.125f));
  EXPECT_FALSE(check_with(4.25f));
  EXPECT_FALSE(check_with(std::numeric_limits<float>::quiet_NaN()));

  // A missing output is an error, not a failed comparison.
  std::filesystem::remove(got / "out.npy");
  EXPECT_FALSE(check_replay_outputs(got.path(), want.path()).ok());
}

TEST(WriteReplayCase, RefusesBadArgumentsAndWritesNothing) {
  const ScopedDir dir("write_bad");
  SparseDecodeArgs args;  // q absent
  const Status status = write_replay_case(dir / "case", args);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("q"), std::string::npos) << status.message();
  EXPECT_FALSE(std::filesystem::exists(dir / "case"));
}

}  // namespace
}  // namespace smla::cli
