// quantize_into_cache / gather_from_cache: paging, slots, strides and
// round-trip accuracy, checked against the float64 oracle in kv_reference.h.
// Hand-worked golden bytes are in codec_golden_test.cc, validation errors in
// codec_validation_test.cc.
#include "smla/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "tests/common/test_common.h"
#include "tests/unit/core/codec_test_util.h"

namespace smla::testing {
namespace {

// Random rows whose tiles span very different magnitudes, including all-zero
// tiles and tiles with amax below 0.0448 (where the CPU and CUDA rules differ).
class RowGenerator {
 public:
  explicit RowGenerator(std::uint64_t seed) : rng_(seed) {}

  std::vector<float> row(int head_dim, int tile) {
    std::vector<float> x(static_cast<std::size_t>(head_dim));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> log_scale(-24, 16);
    std::uniform_int_distribution<int> kind(0, 9);
    for (int start = 0; start < head_dim; start += tile) {
      const int k = kind(rng_);
      const float scale = k == 0 ? 0.0f : std::ldexp(1.0f, log_scale(rng_));
      for (int i = start; i < std::min(start + tile, head_dim); ++i)
        x[static_cast<std::size_t>(i)] = normal(rng_) * scale;
    }
    return x;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

template <class FORMAT>
int tile_of() {
  if constexpr (requires { FORMAT::kTile; }) {
    return FORMAT::kTile;
  } else {
    return 64;
  }
}

template <class FORMAT>
class CodecTyped : public ::testing::Test {};
using AllFormats = ::testing::Types<V4Fp8Format, V32Fp8Format, Bf16RowsFormat, Fp8RowsFormat>;
TYPED_TEST_SUITE(CodecTyped, AllFormats);

template <class FORMAT>
class CodecQuantized : public ::testing::Test {};
using QuantizedFormats = ::testing::Types<V4Fp8Format, V32Fp8Format>;
TYPED_TEST_SUITE(CodecQuantized, QuantizedFormats);

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// Writes n random rows into permuted slots (with some -1) of a cache with odd
// page sizes, padded page strides, strided rows and strided slots; every
// cache byte must equal the oracle's image, then every gathered value must
// equal the oracle's dequantization.
template <class FORMAT>
void check_against_reference(std::int64_t page_size, std::int64_t num_pages, DType row_dtype, DType slot_dtype,
                             DType out_dtype, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << FORMAT::kName << " page_size " << page_size << " rows " << dtype_name(row_dtype)
                                    << " slots " << dtype_name(slot_dtype) << " out " << dtype_name(out_dtype)
                                    << " seed " << seed << " (SMLA_TEST_SEED overrides)");
  constexpr int kHeadDim = FORMAT::kHeadDim;
  const float fp8_scale = FORMAT::kFormat == KvFormat::kFp8Rows ? 0.75f : 1.0f;
  const std::int64_t stride_bytes = FORMAT::page_bytes(page_size) + 64;
  PagedCache cache(FORMAT::kFormat, num_pages, page_size, stride_bytes, fp8_scale);
  RowGenerator generator(seed);

  const std::int64_t num_slots = num_pages * page_size;
  std::vector<std::int64_t> slots(static_cast<std::size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), generator.rng());
  slots.resize(static_cast<std::size_t>(num_slots - num_slots / 3));  // leave some slots unwritten
  slots.insert(slots.begin() + static_cast<std::ptrdiff_t>(slots.size() / 2), -1);
  slots.push_back(-1);
  const auto n = static_cast<std::int64_t>(slots.size());

  RowBuffer rows(row_dtype, n, kHeadDim, kHeadDim + 5);
  std::vector<std::uint8_t> expected_image(cache.bytes.size(), kCanary);
  std::vector<std::vector<double>> expected_values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::vector<float> x = generator.row(kHeadDim, tile_of<FORMAT>());
    std::vector<float> stored(x.size());
    for (int d = 0; d < kHeadDim; ++d) {
      rows.set(i, d, x[static_cast<std::size_t>(d)]);
      stored[static_cast<std::size_t>(d)] = rows.get(i, d);
    }
    const std::int64_t slot = slots[static_cast<std::size_t>(i)];
    if (slot == -1) {
      expected_values[static_cast<std::size_t>(i)].assign(kHeadDim, 0.0);
      continue;
    }
    const std::vector<std::uint8_t> record = ref_encode_record<FORMAT>(stored.data(), fp8_scale);
    place_reference_record<FORMAT>(expected_image, cache, slot, record);
    expected_values[static_cast<std::size_t>(i)] = ref_decode_record<FORMAT>(record, fp8_scale);
  }
  const SlotBuffer slot_view(slot_dtype, slots, 3);

  const Status status = quantize_into_cache(cache.view, rows.view, slot_view.view);
  ASSERT_TRUE(status.ok()) << status.to_string();
  for (std::size_t b = 0; b < expected_image.size(); ++b) {
    ASSERT_EQ(cache.bytes[b], expected_image[b]) << "cache byte " << b << " (page " << b / stride_bytes << ")";
  }

  RowBuffer out(out_dtype, n, kHeadDim, kHeadDim + 3);  // poisoned with NaN, gaps included
  const Status gathered = gather_from_cache(cache.view, slot_view.view, out.view);
  ASSERT_TRUE(gathered.ok()) << gathered.to_string();
  for (std::int64_t i = 0; i < n; ++i) {
    for (int d = 0; d < kHeadDim; ++d) {
      double want = expected_values[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)];
      if (out_dtype == DType::kBF16) want = ref_bf16(want);
      ASSERT_TRUE(same_value(out.get(i, d), want)) << "row " << i << " (slot " << slots[static_cast<std::size_t>(i)]
                                                   << ") dim " << d << ": got " << out.get(i, d) << ", want " << want;
    }
  }
}

TYPED_TEST(CodecTyped, MatchesReferenceOnPermutedSlotsAndOddPageSizes) {
  const std::uint64_t seed = test_seed();
  const DType row_dtypes[] = {DType::kF32, DType::kBF16};
  const DType slot_dtypes[] = {DType::kI32, DType::kI64};
  int variant = 0;
  for (const std::int64_t page_size : {1, 3, 37}) {
    const std::int64_t num_pages = page_size == 37 ? 2 : 5;
    check_against_reference<TypeParam>(page_size, num_pages, row_dtypes[variant % 2], slot_dtypes[(variant / 2) % 2],
                                       row_dtypes[(variant + 1) % 2], seed + static_cast<std::uint64_t>(variant));
    ++variant;
  }
  check_against_reference<TypeParam>(2, 3, DType::kBF16, DType::kI64, DType::kBF16, seed + 7);
}

// |dequant - bf16(x)| <= max(|bf16(x)| * 2^-4, 2^(e - 10)) per tile: half an
// e4m3 ulp for normal codes, half the subnormal step 2^(e-9) otherwise.
TYPED_TEST(CodecQuantized, RoundTripStaysWithinTileBound) {
  using Format = TypeParam;
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (SMLA_TEST_SEED overrides)");
  constexpr std::int64_t kRows = 16;
  PagedCache cache(Format::kFormat, 4, 4, Format::page_bytes(4));
  RowGenerator generator(seed);
  RowBuffer rows(DType::kF32, kRows, Format::kHeadDim, Format::kHeadDim);
  std::vector<std::int64_t> slots(kRows);
  std::iota(slots.begin(), slots.end(), 0);
  std::reverse(slots.begin(), slots.end());
  for (std::int64_t i = 0; i < kRows; ++i) {
    const std::vector<float> x = generator.row(Format::kHeadDim, Format::kTile);
    for (int d = 0; d < Format::kHeadDim; ++d) rows.set(i, d, x[static_cast<std::size_t>(d)]);
  }
  const SlotBuffer slot_view(DType::kI64, slots, 1);
  ASSERT_TRUE(quantize_into_cache(cache.view, rows.view, slot_view.view).ok());
  RowBuffer out(DType::kF32, kRows, Format::kHeadDim, Format::kHeadDim);
  ASSERT_TRUE(gather_from_cache(cache.view, slot_view.view, out.view).ok());

  for (std::int64_t i = 0; i < kRows; ++i) {
    for (int tile = 0; tile < Format::kNumTiles; ++tile) {
      std::vector<double> bf16_values(Format::kTile);
      for (int k = 0; k < Format::kTile; ++k)
        bf16_values[static_cast<std::size_t>(k)] = ref_bf16(rows.get(i, tile * Format::kTile + k));
      const int e = ref_tile_exponent(bf16_values.data(), Format::kTile);
      for (int k = 0; k < Format::kTile; ++k) {
        const double want = bf16_values[static_cast<std::size_t>(k)];
        const double got = out.get(i, tile * Format::kTile + k);
        const double bound = std::max(std::fabs(want) * 0.0625, std::ldexp(1.0, e - 10));
        ASSERT_LE(std::fabs(got - want), bound) << "row " << i << " tile " << tile << " value " << k << " e " << e;
      }
    }
    for (int d = Format::kNopeDim; d < Format::kHeadDim; ++d) {
      ASSERT_EQ(out.get(i, d), ref_bf16(rows.get(i, d))) << "RoPE dims are stored as bf16, row " << i << " dim " << d;
    }
  }
}

TEST(CodecPages, V4ProductionPageSizes) {
  // roundup(64 * 584 = 37376, 576) = 65 * 576 = 37440; roundup(2 * 584 = 1168, 576) = 3 * 576 = 1728.
  EXPECT_EQ(V4Fp8Format::page_bytes(64), 37440);
  EXPECT_EQ(V4Fp8Format::page_bytes(2), 1728);
}

TEST(CodecPages, V4TwoTokenPageOffsetsByHand) {
  // C128 pages: 2 tokens, stride 1728. Slot 3 = page 1, entry 1: its NoPE
  // bytes start at 1728 + 576, RoPE at 1728 + 576 + 448, scales at
  // 1728 + 2 * 576 + 8 = 2888 (7 scales, pad at 2895); bytes [1168, 1728) of
  // a page are alignment padding and stay untouched.
  PagedCache cache(KvFormat::kV4Fp8, 2, 2, 1728);
  std::vector<float> row(512, 1.0f);  // amax 1 -> e = ceil(log2(1/448)) = -8 (byte 119); 1 * 2^8 -> 0x78
  std::vector<std::int32_t> slots = {3};
  ASSERT_TRUE(quantize_into_cache(cache.view, TensorView::contiguous(row.data(), DType::kF32, {1, 512}),
                                  TensorView::contiguous(slots.data(), DType::kI32, {1}))
                  .ok());
  std::vector<std::uint8_t> expected(cache.bytes.size(), kCanary);
  for (int i = 0; i < 448; ++i) expected[1728 + 576 + static_cast<std::size_t>(i)] = 0x78;
  for (int i = 0; i < 64; ++i) {
    expected[1728 + 1024 + 2 * static_cast<std::size_t>(i)] = 0x80;
    expected[1728 + 1024 + 2 * static_cast<std::size_t>(i) + 1] = 0x3F;
  }
  for (int i = 0; i < 7; ++i) expected[2888 + static_cast<std::size_t>(i)] = 119;
  expected[2895] = 0;
  EXPECT_EQ(cache.bytes, expected);
}

TEST(CodecPages, V4SixtyFourTokenPageLastSlot) {
  // Slot 127 = page 1, entry 63: NoPE at 37440 + 63 * 576 = 73728, scales at
  // 37440 + 64 * 576 + 63 * 8 = 74808; [37376, 37440) of page 0 stays canary.
  PagedCache cache(KvFormat::kV4Fp8, 2, 64, 37440);
  std::vector<float> row(512, -1.0f);  // e = -8 (119), code -256 -> 0xF8, RoPE -1.0 = 0xBF80
  std::vector<std::int64_t> slots = {127};
  ASSERT_TRUE(quantize_into_cache(cache.view, TensorView::contiguous(row.data(), DType::kF32, {1, 512}),
                                  TensorView::contiguous(slots.data(), DType::kI64, {1}))
                  .ok());
  std::vector<std::uint8_t> expected(cache.bytes.size(), kCanary);
  for (int i = 0; i < 448; ++i) expected[73728 + static_cast<std::size_t>(i)] = 0xF8;
  for (int i = 0; i < 64; ++i) {
    expected[73728 + 448 + 2 * static_cast<std::size_t>(i)] = 0x80;
    expected[73728 + 448 + 2 * static_cast<std::size_t>(i) + 1] = 0xBF;
  }
  for (int i = 0; i < 7; ++i) expected[74808 + static_cast<std::size_t>(i)] = 119;
  expected[74815] = 0;
  EXPECT_EQ(cache.bytes, expected);
}

TEST(CodecSlots, DuplicateSlotsLastWriteWins) {
  PagedCache cache(KvFormat::kBf16Rows, 1, 2, 2048);
  std::vector<float> rows(3 * 512);
  for (int i = 0; i < 3; ++i) std::fill_n(rows.begin() + i * 512, 512, static_cast<float>(i + 1));
  std::vector<std::int32_t> slots = {1, 0, 1};
  ASSERT_TRUE(quantize_into_cache(cache.view, TensorView::contiguous(rows.data(), DType::kF32, {3, 512}),
                                  TensorView::contiguous(slots.data(), DType::kI32, {3}))
                  .ok());
  const auto* stored = reinterpret_cast<const std::uint16_t*>(cache.bytes.data());
  EXPECT_EQ(stored[0], 0x4000);        // slot 0 <- row 1 (2.0)
  EXPECT_EQ(stored[512 + 5], 0x4040);  // slot 1 <- row 2 (3.0), not row 0 (1.0)
}

TEST(CodecSlots, OutOfRangeSlotIsRejectedAndNothingIsWritten) {
  // 2 pages x 64 tokens = 128 slots; slots[0..2] are valid and would be written first.
  PagedCache cache(KvFormat::kV4Fp8, 2, 64, 37440);
  std::vector<float> rows(5 * 512, 1.0f);
  const TensorView rows_view = TensorView::contiguous(rows.data(), DType::kF32, {5, 512});
  for (const std::int64_t bad : {std::int64_t{128}, std::int64_t{-2}, std::int64_t{1} << 40}) {
    std::vector<std::int64_t> slots = {0, -1, 5, bad, 7};
    const TensorView slot_view = TensorView::contiguous(slots.data(), DType::kI64, {5});
    const Status status = quantize_into_cache(cache.view, rows_view, slot_view);
    EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
    EXPECT_EQ(status.message(), "slots[3]: expected -1 or a slot in [0, 128), got " + std::to_string(bad));
    EXPECT_TRUE(std::all_of(cache.bytes.begin(), cache.bytes.end(), [](std::uint8_t b) { return b == kCanary; }));

    std::vector<float> out(5 * 512, 7.0f);
    const Status gathered =
        gather_from_cache(cache.view, slot_view, TensorView::contiguous(out.data(), DType::kF32, {5, 512}));
    EXPECT_EQ(gathered.code(), StatusCode::kOutOfRange);
    EXPECT_EQ(gathered.message(), status.message());
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; })) << "out was written";
  }
  std::vector<std::int32_t> slots32 = {0, 128};
  const Status status = quantize_into_cache(cache.view, TensorView::contiguous(rows.data(), DType::kF32, {2, 512}),
                                            TensorView::contiguous(slots32.data(), DType::kI32, {2}));
  EXPECT_EQ(status.to_string(), "OutOfRange: slots[1]: expected -1 or a slot in [0, 128), got 128");
}

TEST(CodecSlots, EmptyBatchIsANoOp) {
  PagedCache cache(KvFormat::kV32Fp8, 1, 4, 4 * 656);
  const Status status = quantize_into_cache(cache.view, TensorView::contiguous(nullptr, DType::kBF16, {0, 576}),
                                            TensorView::contiguous(nullptr, DType::kI32, {0}));
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(gather_from_cache(cache.view, TensorView::contiguous(nullptr, DType::kI64, {0}),
                                TensorView::contiguous(nullptr, DType::kF32, {0, 576}))
                  .ok());
}

}  // namespace
}  // namespace smla::testing
