// Every validation path of quantize_into_cache / gather_from_cache returns
// InvalidArgument naming the argument, and writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "smla/codec.h"
#include "tests/unit/core/codec_test_util.h"

namespace smla::testing {
namespace {

struct Call {
  KvCacheView cache;
  TensorView rows;  // rows for quantize, out for gather
  TensorView slots;
};

// A valid V4 call (2 pages x 4 tokens, 2 rows) that each case then breaks.
class CodecValidation : public ::testing::Test {
 protected:
  CodecValidation()
      : cache_(KvFormat::kV4Fp8, 2, 4, V4Fp8Format::page_bytes(4)), rows_(2 * 512 * 2, 1.0f), slots_{1, 6} {}

  Call valid_call() {
    Call call;
    call.cache = cache_.view;
    call.rows = TensorView::contiguous(rows_.data(), DType::kF32, {2, 512});
    call.slots = TensorView::contiguous(slots_.data(), DType::kI32, {2});
    return call;
  }

  // Runs quantize and gather on the broken call; both must fail with
  // InvalidArgument whose message starts with `argument` (gather names its
  // rows "out") and contains `detail`, and leave cache and rows untouched.
  void expect_rejected(const Call& call, const std::string& argument, const std::string& detail) {
    const std::vector<std::uint8_t> cache_before = cache_.bytes;
    const std::vector<float> rows_before = rows_;
    const Status quantized = quantize_into_cache(call.cache, call.rows, call.slots);
    EXPECT_EQ(quantized.code(), StatusCode::kInvalidArgument) << quantized.to_string();
    EXPECT_EQ(quantized.message().rfind(argument + ": expected", 0), 0u) << quantized.message();
    EXPECT_NE(quantized.message().find(detail), std::string::npos) << quantized.message();

    const Status gathered = gather_from_cache(call.cache, call.slots, call.rows);
    const std::string gather_argument = argument == "rows" ? "out" : argument;
    EXPECT_EQ(gathered.code(), StatusCode::kInvalidArgument) << gathered.to_string();
    EXPECT_EQ(gathered.message().rfind(gather_argument + ": expected", 0), 0u) << gathered.message();
    EXPECT_NE(gathered.message().find(detail), std::string::npos) << gathered.message();

    EXPECT_EQ(cache_.bytes, cache_before);
    EXPECT_TRUE(std::equal(rows_.begin(), rows_.end(), rows_before.begin(), [](float a, float b) { return a == b; }));
  }

  PagedCache cache_;
  std::vector<float> rows_;
  std::vector<std::int32_t> slots_;
};

TEST_F(CodecValidation, ValidCallSucceeds) {
  const Call call = valid_call();
  EXPECT_TRUE(quantize_into_cache(call.cache, call.rows, call.slots).ok());
  EXPECT_TRUE(gather_from_cache(call.cache, call.slots, call.rows).ok());
}

TEST_F(CodecValidation, CacheWrongDtype) {
  Call call = valid_call();
  call.cache.pages.dtype = DType::kBF16;
  expect_rejected(call, "cache", "dtype u8");
}

TEST_F(CodecValidation, CacheWrongRank) {
  Call call = valid_call();
  call.cache.pages.rank = 2;
  expect_rejected(call, "cache", "rank 3");
}

TEST_F(CodecValidation, CacheWrongRowBytes) {
  Call call = valid_call();
  call.cache.format = KvFormat::kV32Fp8;  // 656-byte rows expected, the tensor has 584
  expect_rejected(call, "cache", "656");
}

TEST_F(CodecValidation, CachePageStrideTooSmall) {
  Call call = valid_call();
  call.cache.pages.stride[0] = 4 * 584 - 1;
  expect_rejected(call, "cache", "page stride");
}

TEST_F(CodecValidation, CacheNotOnCpu) {
  Call call = valid_call();
  call.cache.pages.device = Device{DeviceKind::kCuda, 0};
  expect_rejected(call, "cache", "cpu");
}

TEST_F(CodecValidation, Fp8RowsScaleMustBePositive) {
  PagedCache fp8(KvFormat::kFp8Rows, 1, 2, 1024);
  fp8.view.fp8_scale = 0.0f;
  Call call = valid_call();
  call.cache = fp8.view;
  expect_rejected(call, "cache.fp8_scale", "positive");
}

TEST_F(CodecValidation, RowsWrongDtype) {
  Call call = valid_call();
  call.rows.dtype = DType::kF16;
  expect_rejected(call, "rows", "bf16 or f32");
}

TEST_F(CodecValidation, RowsWrongRank) {
  Call call = valid_call();
  call.rows = TensorView::contiguous(rows_.data(), DType::kF32, {2, 1, 512});
  expect_rejected(call, "rows", "rank 2");
}

TEST_F(CodecValidation, RowsWrongHeadDim) {
  Call call = valid_call();
  call.rows = TensorView::contiguous(rows_.data(), DType::kF32, {1, 576});  // V3.2's head dim on a V4 cache
  call.slots.shape[0] = 1;
  expect_rejected(call, "rows", "[n, 512]");
}

TEST_F(CodecValidation, RowsLastDimNotContiguous) {
  Call call = valid_call();
  call.rows = TensorView::strided(rows_.data(), DType::kF32, {2, 512}, {1024, 2});
  expect_rejected(call, "rows", "contiguous last dim");
}

TEST_F(CodecValidation, RowsNotOnCpu) {
  Call call = valid_call();
  call.rows.device = Device{DeviceKind::kCuda, 0};
  expect_rejected(call, "rows", "cpu");
}

TEST_F(CodecValidation, RowsAbsent) {
  Call call = valid_call();
  call.rows = TensorView{};
  expect_rejected(call, "rows", "absent");
}

TEST_F(CodecValidation, SlotsWrongDtype) {
  Call call = valid_call();
  call.slots.dtype = DType::kF32;
  expect_rejected(call, "slots", "i32 or i64");
}

TEST_F(CodecValidation, SlotsWrongRank) {
  Call call = valid_call();
  call.slots = TensorView::contiguous(slots_.data(), DType::kI32, {2, 1});
  expect_rejected(call, "slots", "rank 1");
}

TEST_F(CodecValidation, SlotsLengthDiffersFromRows) {
  Call call = valid_call();
  call.slots.shape[0] = 1;
  expect_rejected(call, "slots", "shape [2]");
}

TEST_F(CodecValidation, SlotsNotOnCpu) {
  Call call = valid_call();
  call.slots.device = Device{DeviceKind::kCuda, 0};
  expect_rejected(call, "slots", "cpu");
}

TEST_F(CodecValidation, SlotsNullData) {
  Call call = valid_call();
  call.slots.data = nullptr;
  expect_rejected(call, "slots", "non-null");
}

}  // namespace
}  // namespace smla::testing
