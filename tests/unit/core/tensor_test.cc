#include "smla/tensor.h"

#include <gtest/gtest.h>

#include "smla/backend.h"
#include "smla/kv_format.h"
#include "smla/status.h"

namespace smla {
namespace {

TEST(TensorView, ContiguousStridesAndOffsets) {
  float data[24] = {};
  auto t = TensorView::contiguous(data, DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 4);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.offset_elements({1, 2, 3}), 23);
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] strides [12, 4, 1] cpu");
}

TEST(TensorView, StridedIsNotContiguous) {
  float data[64] = {};
  auto t = TensorView::strided(data, DType::kF32, {2, 4}, {8, 1});
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.ptr_at<float>({1, 3}), data + 11);
}

TEST(TensorView, DefaultIsAbsent) {
  TensorView t;
  EXPECT_FALSE(t.present());
  EXPECT_EQ(t.describe(), "<absent>");
}

TEST(Status, MessageNamesArgumentExpectedAndActual) {
  Status s = invalid_argument("q", "dtype bf16", "f32");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "InvalidArgument: q: expected dtype bf16, got f32");
  EXPECT_EQ(s.with_context("decode: ").message(), "decode: q: expected dtype bf16, got f32");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(Expected, HoldsValueOrStatus) {
  Expected<int> good = 3;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  Expected<int> bad = out_of_range("slot", "< 10", "12");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  Expected<int> misuse = Status::Ok();
  EXPECT_FALSE(misuse.ok());
}

TEST(Backend, ParsesNames) {
  EXPECT_EQ(*parse_backend("reference"), Backend::kReference);
  EXPECT_FALSE(parse_backend("tpu").ok());
  EXPECT_TRUE(backend_available(Backend::kReference));
}

TEST(KvFormat, InfoAndValidation) {
  EXPECT_EQ(kv_format_info(KvFormat::kV4Fp8).bytes_per_token, 584);
  EXPECT_EQ(kv_format_info(KvFormat::kV32Fp8).head_dim, 576);
  EXPECT_EQ(*parse_kv_format("v32-fp8"), KvFormat::kV32Fp8);
  EXPECT_FALSE(parse_kv_format("v5").ok());

  std::vector<std::uint8_t> buf(V4Fp8Format::page_bytes(64) * 3);
  KvCacheView cache;
  cache.format = KvFormat::kV4Fp8;
  cache.pages = TensorView::strided(buf.data(), DType::kU8, {3, 64, 584}, {37440, 584, 1});
  EXPECT_TRUE(validate_kv_cache(cache, "cache").ok());
  cache.pages.stride[0] = 584 * 63;  // page stride too small for 64 tokens
  Status s = validate_kv_cache(cache, "cache");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("page stride"), std::string::npos) << s.message();
  cache.pages = TensorView::contiguous(buf.data(), DType::kBF16, {3, 64, 584});
  EXPECT_FALSE(validate_kv_cache(cache, "cache").ok());
}

}  // namespace
}  // namespace smla
