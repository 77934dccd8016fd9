// Reference sparse decode on tiny cases whose expected values are written by
// hand from the definition (std::exp on the literal logits).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "smla/attention.h"
#include "tests/common/test_common.h"
#include "tests/unit/reference/hand_case.h"

namespace smla::testing {
namespace {

using hand::bf16_tol;
using hand::f32_at;
using hand::out_at;
using testkit::HostTensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kDim = Bf16RowsFormat::kHeadDim;

// One head, bf16 rows, page size 2, three pages. Key A at slot 3, key B at slot 0:
//   A = 2 e0 - 1 e5, B = 1 e0 + 3 e1; q = e0 + 0.5 e1 - 1 e5; scale 0.5
//   s_A = 0.5 * (2 + 1) = 1.5, s_B = 0.5 * (1 + 1.5) = 1.25.
struct TwoKeys {
  HostTensor cache = hand::nan_cache(KvFormat::kBf16Rows, 3, 2);
  HostTensor q = hand::q_tensor(1, 1, kDim, {{{0, 0, 0}, 1.0f}, {{0, 0, 1}, 0.5f}, {{0, 0, 5}, -1.0f}});
  HostTensor out = HostTensor::zeros(DType::kBF16, {1, 1, kDim});
  HostTensor lse = HostTensor::zeros(DType::kF32, {1, 1});
  HostTensor indices, lengths, sink;

  TwoKeys() {
    hand::put_bf16_row(cache, 3, {{0, 2.0f}, {5, -1.0f}});
    hand::put_bf16_row(cache, 0, {{0, 1.0f}, {1, 3.0f}});
  }
  SparseDecodeArgs args() {
    testkit::poison(out.view());
    testkit::poison(lse.view());
    SparseDecodeArgs a;
    a.q = q.view();
    a.main_cache = KvCacheView{cache.view(), KvFormat::kBf16Rows};
    a.main_indices = indices.view();
    a.main_lengths = lengths.view();
    a.sink = sink.view();
    a.softmax_scale = 0.5f;
    a.out = out.view();
    a.lse = lse.view();
    return a;
  }
};

// Expected out of the two keys with weights wa, wb (unnormalized) and extra denominator mass.
void expect_two_key_output(const TensorView& out, double wa, double wb, double extra_mass) {
  const double den = wa + wb + extra_mass;
  EXPECT_NEAR(out_at(out, 0, 0, 0), (2 * wa + 1 * wb) / den, bf16_tol((2 * wa + wb) / den));
  EXPECT_NEAR(out_at(out, 0, 0, 1), 3 * wb / den, bf16_tol(3 * wb / den));
  EXPECT_NEAR(out_at(out, 0, 0, 5), -wa / den, bf16_tol(wa / den));
  for (int d : {2, 3, 4, 6, 100, 511}) EXPECT_EQ(out_at(out, 0, 0, d), 0.0f) << "dim " << d;
}

TEST(ReferenceDecodeHand, TwoKeysWithInvalidEntriesSkipped) {
  TwoKeys c;
  // -1, one past the last slot and INT32_MAX are not attended (and never read).
  c.indices = hand::i32_matrix({{3, -1, 0, 6, std::numeric_limits<std::int32_t>::max()}});
  ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
  expect_two_key_output(c.out.view(), std::exp(1.5), std::exp(1.25), 0.0);
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(std::exp(1.5) + std::exp(1.25)), 1e-6);
}

TEST(ReferenceDecodeHand, SinkJoinsTheDenominatorButNotLse) {
  TwoKeys c;
  c.indices = hand::i32_matrix({{3, 0}});
  c.sink = hand::f32_vector({0.75f});
  ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
  expect_two_key_output(c.out.view(), std::exp(1.5), std::exp(1.25), std::exp(0.75));
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(std::exp(1.5) + std::exp(1.25)), 1e-6);
}

TEST(ReferenceDecodeHand, SinkPlusInfinityZeroesTheOutput) {
  TwoKeys c;
  c.indices = hand::i32_matrix({{3, 0}});
  c.sink = hand::f32_vector({kInf});
  ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
  for (int d = 0; d < kDim; ++d) ASSERT_EQ(out_at(c.out.view(), 0, 0, d), 0.0f) << "dim " << d;
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(std::exp(1.5) + std::exp(1.25)), 1e-6);
}

TEST(ReferenceDecodeHand, DuplicateIndicesAreAttendedEachTime) {
  TwoKeys c;
  c.indices = hand::i32_matrix({{3, 0, 3}});
  ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
  expect_two_key_output(c.out.view(), 2 * std::exp(1.5), std::exp(1.25), 0.0);
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(2 * std::exp(1.5) + std::exp(1.25)), 1e-6);
}

TEST(ReferenceDecodeHand, LengthTruncatesTheIndexList) {
  TwoKeys c;
  c.indices = hand::i32_matrix({{3, 0}});
  c.lengths = hand::i32_vector({1});  // only key A: softmax of one key is 1
  ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 0), 2.0f);
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 1), 0.0f);
  EXPECT_EQ(out_at(c.out.view(), 0, 0, 5), -1.0f);
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), 1.5, 1e-6);
}

TEST(ReferenceDecodeHand, EmptyRowsGiveZeroAndInfiniteLse) {
  for (const bool with_sink : {false, true}) {
    for (const bool zero_length : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "sink " << with_sink << " zero_length " << zero_length);
      TwoKeys c;
      c.indices = zero_length ? hand::i32_matrix({{3, 0}}) : hand::i32_matrix({{-1, -1}});
      if (zero_length) c.lengths = hand::i32_vector({0});
      if (with_sink) c.sink = hand::f32_vector({0.5f});
      ASSERT_TRUE(IsOk(sparse_decode(c.args(), Backend::kReference)));
      for (int d = 0; d < kDim; ++d) ASSERT_EQ(out_at(c.out.view(), 0, 0, d), 0.0f) << "dim " << d;
      EXPECT_EQ(f32_at(c.lse.view(), 0, 0), kInf);
    }
  }
}

TEST(ReferenceDecodeHand, MainAndExtraCachesShareOneSoftmax) {
  TwoKeys c;
  c.indices = hand::i32_matrix({{3}});
  // Key B lives in an extra cache with its own page size (3) at slot 4.
  HostTensor extra = hand::nan_cache(KvFormat::kBf16Rows, 2, 3);
  hand::put_bf16_row(extra, 4, {{0, 1.0f}, {1, 3.0f}});
  HostTensor extra_indices = hand::i32_matrix({{-1, 4}});
  SparseDecodeArgs a = c.args();
  a.extra_cache = KvCacheView{extra.view(), KvFormat::kBf16Rows};
  a.extra_indices = extra_indices.view();
  ASSERT_TRUE(IsOk(sparse_decode(a, Backend::kReference)));
  expect_two_key_output(c.out.view(), std::exp(1.5), std::exp(1.25), 0.0);
  EXPECT_NEAR(f32_at(c.lse.view(), 0, 0), std::log(std::exp(1.5) + std::exp(1.25)), 1e-6);
}

// V4 bytes written by hand from the layout of kv_format.h.
//   Key A (slot 1): NoPE dim 0 = e4m3 0x40 (2.0) x tile-0 scale byte 128 (2.0) = 4.0; RoPE dim 448 = 1.0.
//   Key B (slot 2): NoPE dim 64 = e4m3 0x38 (1.0) x tile-1 scale byte 126 (0.5) = 0.5.
//   q = e0 + 2 e64 + 1.5 e448, scale 0.25: s_A = 0.25 * (4 + 1.5) = 1.375, s_B = 0.25 * 1 = 0.25.
TEST(ReferenceDecodeHand, V4Fp8BytesDecodedByHand) {
  using F = V4Fp8Format;
  const std::int64_t page_size = 2;
  HostTensor cache = hand::nan_cache(KvFormat::kV4Fp8, 2, page_size);
  auto write_token = [&](std::int64_t slot, int dim, std::uint8_t code, int tile, std::uint8_t scale_byte,
                         float rope0) {
    std::int64_t t = 0;
    std::uint8_t* page = hand::slot_bytes(cache, slot, &t);
    std::memset(page + F::nope_offset(t, page_size), 0, F::kNopeDim);
    std::memset(page + F::scale_offset(t, page_size), 127, F::kNumTiles);  // 2^0
    std::memset(page + F::rope_offset(t, page_size), 0, 2 * F::kRopeDim);
    page[F::nope_offset(t, page_size) + dim] = code;
    page[F::scale_offset(t, page_size) + tile] = scale_byte;
    const std::uint16_t rope_bits = f32_to_bf16(rope0);
    std::memcpy(page + F::rope_offset(t, page_size), &rope_bits, 2);
  };
  write_token(1, 0, 0x40, 0, 128, 1.0f);
  write_token(2, 64, 0x38, 1, 126, 0.0f);
  HostTensor q = hand::q_tensor(1, 1, F::kHeadDim, {{{0, 0, 0}, 1.0f}, {{0, 0, 64}, 2.0f}, {{0, 0, 448}, 1.5f}});
  HostTensor indices = hand::i32_matrix({{2, 1}});
  HostTensor out = HostTensor::zeros(DType::kBF16, {1, 1, F::kValueDim});
  HostTensor lse = HostTensor::zeros(DType::kF32, {1, 1});
  SparseDecodeArgs a;
  a.q = q.view();
  a.main_cache = KvCacheView{cache.view(), KvFormat::kV4Fp8};
  a.main_indices = indices.view();
  a.softmax_scale = 0.25f;
  a.out = out.view();
  a.lse = lse.view();
  ASSERT_TRUE(IsOk(sparse_decode(a, Backend::kReference)));
  const double wa = std::exp(1.375), wb = std::exp(0.25);
  EXPECT_NEAR(out_at(out.view(), 0, 0, 0), 4.0 * wa / (wa + wb), bf16_tol(4.0 * wa / (wa + wb)));
  EXPECT_NEAR(out_at(out.view(), 0, 0, 64), 0.5 * wb / (wa + wb), bf16_tol(0.5 * wb / (wa + wb)));
  EXPECT_NEAR(out_at(out.view(), 0, 0, 448), wa / (wa + wb), bf16_tol(wa / (wa + wb)));  // RoPE dims are values too
  EXPECT_EQ(out_at(out.view(), 0, 0, 1), 0.0f);
  EXPECT_NEAR(f32_at(lse.view(), 0, 0), std::log(wa + wb), 1e-6);
}

// V3.2: 576-dim keys whose value is the 512 NoPE dims only.
//   Key A (slot 0): NoPE dim 0 = e4m3 0x38 (1.0) x f32 scale 0.25; RoPE dim 512 = 2.0.
//   Key B (slot 1): all zero.  q = 4 e0 + 1 e512, scale 0.5: s_A = 0.5 * (1 + 2) = 1.5, s_B = 0.
TEST(ReferenceDecodeHand, V32Fp8BytesDecodedByHand) {
  using F = V32Fp8Format;
  HostTensor cache = hand::nan_cache(KvFormat::kV32Fp8, 1, 3);
  for (std::int64_t slot : {0, 1}) {
    std::int64_t t = 0;
    std::uint8_t* page = hand::slot_bytes(cache, slot, &t);
    std::memset(page + F::nope_offset(t, 3), 0, F::kBytesPerToken);
    for (int tile = 0; tile < F::kNumTiles; ++tile) {
      const float scale = slot == 0 && tile == 0 ? 0.25f : 1.0f;
      std::memcpy(page + F::scale_offset(t, 3) + 4 * tile, &scale, 4);
    }
    if (slot == 0) {
      page[F::nope_offset(t, 3)] = 0x38;
      const std::uint16_t two = f32_to_bf16(2.0f);
      std::memcpy(page + F::rope_offset(t, 3), &two, 2);
    }
  }
  HostTensor q = hand::q_tensor(1, 1, F::kHeadDim, {{{0, 0, 0}, 4.0f}, {{0, 0, 512}, 1.0f}});
  HostTensor indices = hand::i32_matrix({{0, 1, 2}});  // slot 2 holds NaN bytes: the length stops before it
  HostTensor lengths = hand::i32_vector({2});
  HostTensor out = HostTensor::zeros(DType::kBF16, {1, 1, F::kValueDim});
  HostTensor lse = HostTensor::zeros(DType::kF32, {1, 1});
  SparseDecodeArgs a;
  a.q = q.view();
  a.main_cache = KvCacheView{cache.view(), KvFormat::kV32Fp8};
  a.main_indices = indices.view();
  a.main_lengths = lengths.view();
  a.softmax_scale = 0.5f;
  a.out = out.view();
  a.lse = lse.view();
  ASSERT_TRUE(IsOk(sparse_decode(a, Backend::kReference)));
  const double wa = std::exp(1.5), wb = 1.0;
  EXPECT_NEAR(out_at(out.view(), 0, 0, 0), 0.25 * wa / (wa + wb), bf16_tol(0.25 * wa / (wa + wb)));
  for (int d = 1; d < F::kValueDim; ++d) ASSERT_EQ(out_at(out.view(), 0, 0, d), 0.0f) << "dim " << d;
  EXPECT_NEAR(f32_at(lse.view(), 0, 0), std::log(wa + wb), 1e-6);
}

}  // namespace
}  // namespace smla::testing
