// The CPU sparse-attention kernel, compiled once per SIMD target (Highway
// foreach_target) and chosen at run time by dynamic dispatch.
//
// One call computes a block of heads of one query token (MQA: every head reads
// the same KV rows):
//   1. collect the token's attended rows (position < length, 0 <= index < rows)
//      from both index sets into one list;
//   2. for each chunk of kKeyChunk rows: dequantize the rows once into an f32
//      tile [keys, d_qk] that stays in L2, then for every tile of kHeadTile heads
//      S = Q K^T (register-blocked kHeadTile x kKeyTile vector accumulators),
//      online-softmax update in f32, O = alpha O + P V (kHeadTile x kValueTile
//      vector accumulators);
//   3. finish with the sink: out = O / (l + exp(sink - scale m)), lse = scale m + log l
//      (m: the running max of the raw dot products; docs/attention.md, non-finite values).
// Every (head, key) score and (head, value lane) sum is one vector chain in a
// fixed order whatever the tile shapes, so results depend only on the chunk
// boundaries, never on the head grouping or on the thread that ran it.
// FLOP per (head, key) = 2 (d_qk + d_v); the dequantization is amortized over
// every head of the block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "src/core/kv_rows.h"
#include "src/cpu/attention_kernel.h"
#include "src/cpu/simd_targets.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/attention_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target re-includes this file per target; the includes below must follow it.
#include "hwy/aligned_allocator.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace smla::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using detail::AttentionOperands;
using detail::KeySetOperands;
using detail::RowSource;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Rows dequantized together: 64 x 576 f32 = 144 KiB, L2-resident next to the
// per-head accumulators while every head block reuses them.
constexpr int kKeyChunk = 64;
// Register blocking: QK keeps kHeadTile x kKeyTile accumulators, PV kHeadTile x
// kValueTile, plus kKeyTile (kValueTile) + 1 operand registers: 15 of AVX2's
// 16. Six heads per tile means each K/V vector loaded from L2 feeds six FMAs.
// (4 x 4 key/value tiles for AVX-512's 32 registers measured no faster: the
// per-score horizontal sums and L2 traffic dominate there.)
constexpr int kHeadTile = 6;
constexpr int kKeyTile = 2;
constexpr int kValueTile = 2;
// Row length padding (floats): a multiple of every target's vector length.
constexpr int kRowAlign = 16;

constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// One attended row: where its bytes are (format-specific meaning).
struct KeyRow {
  const std::uint8_t* data;    // e4m3 NoPE values, or the whole bf16/e4m3 row
  const std::uint8_t* scales;  // per-tile scales (V4, V3.2)
  const std::uint8_t* rope;    // bf16 RoPE values (V4, V3.2)
  float fp8_scale;             // per-tensor scale (fp8 rows)
};

// The prefill workspace's row type: d_qk bf16 values per row.
struct FlatBf16Rows {};

// ---------------------------------------------------------------------------
// Row decoding (bit-exact with detail::decode_token).

// e4m3 -> f16 is a shift: s eeee mmm becomes the f16 s 0eeee mmm0000000,
// whose value is the e4m3 value / 2^8 exactly, subnormals included (f16's
// exponent bias is 8 more). The hardware f16 -> f32 conversion does the rest
// and the 2^8 is folded into the scale.
constexpr float kE4m3ViaF16Factor = 256.0f;
// Scales up to this keep scale * 2^8 finite; larger (or NaN) scales take the scalar path.
constexpr float kMaxFoldedScale = 0x1p119f;

// Lanes(df) e4m3 codes to f32, times scale_times_256 / 2^8.
HWY_INLINE VF DecodeE4m3(const std::uint8_t* codes, VF scale_times_256) {
  const DF df;
  const hn::Rebind<std::uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<std::uint8_t, DF> d8;
  const auto code = hn::PromoteTo(d16, hn::LoadU(d8, codes));
  const auto bits = hn::Or(hn::ShiftLeft<8>(hn::And(code, hn::Set(d16, std::uint16_t{0x80}))),
                           hn::ShiftLeft<7>(hn::And(code, hn::Set(d16, std::uint16_t{0x7F}))));
  const VF value = hn::PromoteTo(df, hn::BitCast(dh, bits));
  // The NaN codes 0x7F/0xFF became +-1.875, a magnitude no other code yields.
  const VF checked = hn::IfThenElse(hn::Eq(hn::Abs(value), hn::Set(df, 1.875f)),
                                    hn::Set(df, std::numeric_limits<float>::quiet_NaN()), value);
  return hn::Mul(checked, scale_times_256);
}

// count (a multiple of Lanes(df)) e4m3 codes times scale into dst.
HWY_INLINE void DecodeE4m3Span(const std::uint8_t* codes, int count, float scale, float* HWY_RESTRICT dst) {
  const DF df;
  const int n = static_cast<int>(hn::Lanes(df));
  if (!(std::abs(scale) <= kMaxFoldedScale)) {
    for (int i = 0; i < count; ++i) dst[i] = e4m3_to_f32(codes[i]) * scale;
    return;
  }
  const VF folded = hn::Set(df, scale * kE4m3ViaF16Factor);
  for (int i = 0; i < count; i += n) hn::Store(DecodeE4m3(codes + i, folded), df, dst + i);
}

// Lanes(df) bf16 values to f32.
HWY_INLINE VF DecodeBf16(const std::uint8_t* bytes) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<std::uint16_t, DF> d16;
  std::uint16_t bits[hn::MaxLanes(df)];
  std::memcpy(bits, bytes, sizeof(std::uint16_t) * hn::Lanes(df));
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, bits))));
}

template <class FORMAT>
KeyRow RowOfEntry(const std::uint8_t* page, std::int64_t entry, std::int64_t page_size, float fp8_scale) {
  if constexpr (FORMAT::kLayout == KvRowLayout::kTiledNopeRope) {
    return {page + FORMAT::nope_offset(entry, page_size), page + FORMAT::scale_offset(entry, page_size),
            page + FORMAT::rope_offset(entry, page_size), fp8_scale};
  } else {
    return {page + entry * FORMAT::kBytesPerToken, nullptr, nullptr, fp8_scale};
  }
}

// Writes row_len = round_up(d_qk, kRowAlign) floats: the row, then zeros.
template <class FORMAT>
HWY_INLINE void DecodeRow(const KeyRow& row, int d_qk, float* HWY_RESTRICT dst) {
  const DF df;
  const int n = static_cast<int>(hn::Lanes(df));
  if constexpr (std::is_same_v<FORMAT, FlatBf16Rows>) {
    int i = 0;
    for (; i + n <= d_qk; i += n) hn::Store(DecodeBf16(row.data + 2 * i), df, dst + i);
    for (; i < d_qk; ++i) dst[i] = bf16_to_f32(detail::load_u16(row.data + 2 * i));
  } else if constexpr (FORMAT::kLayout == KvRowLayout::kTiledNopeRope) {
    for (int tile = 0; tile < FORMAT::kNumTiles; ++tile) {
      const float scale = FORMAT::tile_scale(row.scales, tile);
      DecodeE4m3Span(row.data + tile * FORMAT::kTile, FORMAT::kTile, scale, dst + tile * FORMAT::kTile);
    }
    for (int i = 0; i < FORMAT::kRopeDim; i += n) {
      hn::Store(DecodeBf16(row.rope + 2 * i), df, dst + FORMAT::kNopeDim + i);
    }
  } else if constexpr (FORMAT::kStorage == DType::kBF16) {
    for (int i = 0; i < FORMAT::kHeadDim; i += n) hn::Store(DecodeBf16(row.data + 2 * i), df, dst + i);
  } else {
    static_assert(FORMAT::kLayout == KvRowLayout::kPlainRows && FORMAT::kStorage == DType::kE4M3,
                  "a row layout without a SIMD decoder here (KvRowLayout)");
    DecodeE4m3Span(row.data, FORMAT::kHeadDim, row.fp8_scale, dst);
  }
  for (int i = d_qk; i < round_up(d_qk, kRowAlign); ++i) dst[i] = 0.0f;
}

// The attended rows of `token`, main set first, each in index order.
template <class FORMAT>
void CollectRows(const AttentionOperands& p, std::int64_t token, std::vector<KeyRow>* rows) {
  rows->clear();
  for (int s = 0; s < p.num_sets; ++s) {
    const KeySetOperands& set = p.sets[s];
    if (set.indices == nullptr) continue;
    std::int64_t length = set.width;
    if (set.lengths != nullptr) {
      length = std::clamp<std::int64_t>(set.lengths[token * set.stride_lengths_t], 0, set.width);
    }
    const std::int32_t* indices = set.indices + token * set.stride_indices_t;
    for (std::int64_t j = 0; j < length; ++j) {
      const std::int64_t index = indices[j];
      if (index < 0 || index >= set.num_slots) continue;
      if constexpr (std::is_same_v<FORMAT, FlatBf16Rows>) {
        rows->push_back({set.pages + index * set.row_stride_bytes, nullptr, nullptr, 1.0f});
      } else {
        const std::uint8_t* page = set.pages + (index / set.page_size) * set.page_stride_bytes;
        rows->push_back(RowOfEntry<FORMAT>(page, index % set.page_size, set.page_size, set.fp8_scale));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Register-blocked micro-kernels. Rows are aligned and padded to kRowAlign.

// s[h * s_stride + k] = <q_h, k_k> for HT heads and KT keys.
template <int HT, int KT>
HWY_INLINE void QkTile(const float* HWY_RESTRICT q, std::int64_t row_len, const float* HWY_RESTRICT k,
                       float* HWY_RESTRICT s, std::int64_t s_stride) {
  const DF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[HT][KT];
  for (int h = 0; h < HT; ++h) {
    for (int j = 0; j < KT; ++j) acc[h][j] = hn::Zero(df);
  }
  for (std::int64_t i = 0; i < row_len; i += n) {
    VF kv[KT];
    for (int j = 0; j < KT; ++j) kv[j] = hn::Load(df, k + j * row_len + i);
    for (int h = 0; h < HT; ++h) {
      const VF qv = hn::Load(df, q + h * row_len + i);
      for (int j = 0; j < KT; ++j) acc[h][j] = hn::MulAdd(qv, kv[j], acc[h][j]);
    }
  }
  for (int h = 0; h < HT; ++h) {
    for (int j = 0; j < KT; ++j) s[h * s_stride + j] = hn::GetLane(hn::SumOfLanes(df, acc[h][j]));
  }
}

// The last num_keys % KT keys, with the largest smaller tile that fits.
template <int HT, int KT>
HWY_INLINE void QkRemainder(int remaining, const float* q, std::int64_t row_len, const float* k, float* s) {
  if constexpr (KT > 0) {
    if (remaining == KT) {
      QkTile<HT, KT>(q, row_len, k, s, kKeyChunk);
    } else {
      QkRemainder<HT, KT - 1>(remaining, q, row_len, k, s);
    }
  }
}

template <int HT>
void QkHeads(const float* q, std::int64_t row_len, const float* k_tile, int num_keys, float* s) {
  int k = 0;
  for (; k + kKeyTile <= num_keys; k += kKeyTile) QkTile<HT, kKeyTile>(q, row_len, k_tile + k * row_len, s + k, kKeyChunk);
  QkRemainder<HT, kKeyTile - 1>(num_keys - k, q, row_len, k_tile + k * row_len, s + k);
}

// o_h = alpha_h o_h + sum_k p[h][k] v_k over VT vectors of HT heads.
template <int HT, int VT>
HWY_INLINE void PvTile(const float* HWY_RESTRICT p, int num_keys, const float* HWY_RESTRICT v, std::int64_t row_len,
                       float* HWY_RESTRICT o, std::int64_t o_stride, const float* alpha) {
  const DF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[HT][VT];
  for (int h = 0; h < HT; ++h) {
    const VF a = hn::Set(df, alpha[h]);
    for (int j = 0; j < VT; ++j) acc[h][j] = hn::Mul(hn::Load(df, o + h * o_stride + j * n), a);
  }
  for (int k = 0; k < num_keys; ++k) {
    VF vv[VT];
    for (int j = 0; j < VT; ++j) vv[j] = hn::Load(df, v + k * row_len + j * n);
    for (int h = 0; h < HT; ++h) {
      const VF pb = hn::Set(df, p[h * kKeyChunk + k]);
      for (int j = 0; j < VT; ++j) acc[h][j] = hn::MulAdd(pb, vv[j], acc[h][j]);
    }
  }
  for (int h = 0; h < HT; ++h) {
    for (int j = 0; j < VT; ++j) hn::Store(acc[h][j], df, o + h * o_stride + j * n);
  }
}

template <int HT, int VT>
HWY_INLINE void PvRemainder(std::int64_t remaining_vectors, const float* p, int num_keys, const float* v,
                            std::int64_t row_len, float* o, std::int64_t o_len, const float* alpha) {
  if constexpr (VT > 0) {
    if (remaining_vectors == VT) {
      PvTile<HT, VT>(p, num_keys, v, row_len, o, o_len, alpha);
    } else {
      PvRemainder<HT, VT - 1>(remaining_vectors, p, num_keys, v, row_len, o, o_len, alpha);
    }
  }
}

template <int HT>
void PvHeads(const float* p, int num_keys, const float* v_tile, std::int64_t row_len, float* o, std::int64_t o_len,
             const float* alpha) {
  const DF df;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t d = 0;
  for (; d + kValueTile * n <= o_len; d += kValueTile * n) {
    PvTile<HT, kValueTile>(p, num_keys, v_tile + d, row_len, o + d, o_len, alpha);
  }
  PvRemainder<HT, kValueTile - 1>((o_len - d) / n, p, num_keys, v_tile + d, row_len, o + d, o_len, alpha);
}

// Calls fn(std::integral_constant<int, HT>) with HT = heads in [1, kHeadTile].
template <int HT = kHeadTile, class FN>
HWY_INLINE void WithHeadTile(int heads, FN&& fn) {
  if constexpr (HT > 1) {
    if (heads != HT) {
      WithHeadTile<HT - 1>(heads, fn);
      return;
    }
  }
  fn(std::integral_constant<int, HT>{});
}

// ---------------------------------------------------------------------------

// Per-thread buffers, grown on demand and kept between calls.
struct Scratch {
  std::vector<KeyRow> rows;
  hwy::AlignedFreeUniquePtr<float[]> k_tile, q_tile, scores, acc;
  std::int64_t k_tile_size = 0, acc_size = 0;
  std::vector<float> running_max, running_sum;

  void reserve(std::int64_t row_len, std::int64_t acc_floats) {
    if (k_tile_size < kKeyChunk * row_len) {
      k_tile_size = kKeyChunk * row_len;
      k_tile = hwy::AllocateAligned<float>(static_cast<std::size_t>(k_tile_size));
      q_tile = hwy::AllocateAligned<float>(static_cast<std::size_t>(kHeadTile * row_len));
    }
    if (!scores) {
      scores = hwy::AllocateAligned<float>(kHeadTile * kKeyChunk);
      std::fill(scores.get(), scores.get() + kHeadTile * kKeyChunk, 0.0f);
    }
    if (acc_size < acc_floats) {
      acc_size = acc_floats;
      acc = hwy::AllocateAligned<float>(static_cast<std::size_t>(acc_size));
    }
  }
};

Scratch& thread_scratch() {
  static thread_local Scratch scratch;
  return scratch;
}

// Online-softmax update of `heads` heads over one chunk: scores become
// probabilities relative to the new running max, alpha rescales the old sums.
// Max and sum are vector reductions (a scalar loop would be a 64-long
// dependency chain per head); lanes past num_keys are masked out.
// Scores and the running max are raw dot products <q, k>; the softmax scale is
// applied to differences, p = exp((s - m) scale) with an argument <= 0, so a
// scale times logit beyond f32 never becomes inf - inf (docs/attention.md). A NaN
// argument (NaN score, or +inf - +inf) stays NaN: Highway's Exp would return 0, and
// must not see it at all (its float -> int step is undefined for NaN; UBSan says so
// on the scalar target), so it gets 0 there instead.
void SoftmaxChunk(float* scores, int heads, int num_keys, float scale, float* running_max, float* running_sum,
                  float* alpha) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const DF df;
  const int n = static_cast<int>(hn::Lanes(df));
  const int padded = static_cast<int>(round_up(num_keys, n));
  for (int h = 0; h < heads; ++h) {
    float* s = scores + h * kKeyChunk;
    for (int k = num_keys; k < padded; ++k) s[k] = -kInf;
    VF max_v = hn::Set(df, -kInf);
    for (int k = 0; k < padded; k += n) max_v = hn::Max(max_v, hn::Load(df, s + k));
    const float new_max = std::max(running_max[h], hn::GetLane(hn::MaxOfLanes(df, max_v)));
    alpha[h] = running_max[h] == -kInf ? 0.0f : std::exp((running_max[h] - new_max) * scale);
    const VF new_max_v = hn::Set(df, new_max);
    const VF scale_v = hn::Set(df, scale);
    VF sum_v = hn::Zero(df);
    for (int k = 0; k < padded; k += n) {
      const VF x = hn::Mul(hn::Sub(hn::Load(df, s + k), new_max_v), scale_v);
      const auto nan = hn::IsNaN(x);
      const VF p = hn::IfThenElse(nan, x, hn::Exp(df, hn::IfThenZeroElse(nan, x)));
      const VF masked = hn::IfThenElseZero(hn::FirstN(df, static_cast<std::size_t>(num_keys - k)), p);
      hn::Store(masked, df, s + k);
      sum_v = hn::Add(sum_v, masked);
    }
    running_sum[h] = running_sum[h] * alpha[h] + hn::GetLane(hn::SumOfLanes(df, sum_v));
    running_max[h] = new_max;
  }
}

// q (bf16) of `heads` heads into padded f32 rows (unscaled: see SoftmaxChunk).
void LoadQueries(const AttentionOperands& p, std::int64_t token, std::int64_t head, int heads, std::int64_t row_len,
                 float* dst) {
  const DF df;
  const int n = static_cast<int>(hn::Lanes(df));
  for (int h = 0; h < heads; ++h) {
    const std::uint16_t* q = p.q + token * p.stride_q_t + (head + h) * p.stride_q_h;
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(q);
    float* row = dst + h * row_len;
    int i = 0;
    for (; i + n <= p.d_qk; i += n) hn::Store(DecodeBf16(bytes + 2 * i), df, row + i);
    for (; i < p.d_qk; ++i) row[i] = bf16_to_f32(q[i]);
    for (std::int64_t j = p.d_qk; j < row_len; ++j) row[j] = 0.0f;
  }
}

void FinishHeads(const AttentionOperands& p, std::int64_t token, std::int64_t head_begin, std::int64_t heads,
                 bool empty, const float* acc, std::int64_t acc_len, const float* running_max,
                 const float* running_sum) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t head = head_begin + h;
    std::uint16_t* out = p.out + token * p.stride_out_t + head * p.stride_out_h;
    float lse = kInf, max_logit = -kInf, inv_denominator = 0.0f;
    if (!empty) {
      const float sink = p.sink != nullptr ? p.sink[head * p.stride_sink] : -kInf;
      // The scaled max may overflow f32 (then lse and max_logits are +-inf, the
      // output stays exact). exp(sink - m) relates the sink to the sum's reference
      // point m; an infinite sink is taken as it is so that no inf - inf arises.
      const float scaled_max = running_max[h] * p.softmax_scale;
      const float sink_term = sink == -kInf ? 0.0f : sink == kInf ? kInf : std::exp(sink - scaled_max);
      const float sum = running_sum[h];
      inv_denominator = 1.0f / (sum + sink_term);
      lse = scaled_max + std::log(sum);
      max_logit = std::isnan(sum) ? std::numeric_limits<float>::quiet_NaN() : scaled_max;
    }
    const float* o = acc + h * acc_len;
    for (int i = 0; i < p.d_v; ++i) out[i] = f32_to_bf16(empty ? 0.0f : o[i] * inv_denominator);
    if (p.lse != nullptr) p.lse[token * p.stride_lse_t + head * p.stride_lse_h] = lse;
    if (p.max_logits != nullptr) {
      p.max_logits[token * p.stride_max_t + head * p.stride_max_h] = max_logit;
    }
  }
}

template <class FORMAT>
void Attend(const AttentionOperands& p, std::int64_t token, std::int64_t head_begin, std::int64_t head_end) {
  const std::int64_t row_len = round_up(p.d_qk, kRowAlign);
  const std::int64_t acc_len = round_up(p.d_v, kRowAlign);  // <= row_len: V is the row's prefix
  const std::int64_t heads = head_end - head_begin;
  Scratch& scratch = thread_scratch();
  scratch.reserve(row_len, heads * acc_len);
  CollectRows<FORMAT>(p, token, &scratch.rows);
  const std::int64_t num_rows = static_cast<std::int64_t>(scratch.rows.size());

  float* k_tile = scratch.k_tile.get();
  float* q_tile = scratch.q_tile.get();
  float* scores = scratch.scores.get();
  float* acc = scratch.acc.get();
  std::fill(acc, acc + heads * acc_len, 0.0f);
  scratch.running_max.assign(static_cast<std::size_t>(heads), -std::numeric_limits<float>::infinity());
  scratch.running_sum.assign(static_cast<std::size_t>(heads), 0.0f);
  float alpha[kHeadTile];

  for (std::int64_t chunk = 0; chunk < num_rows; chunk += kKeyChunk) {
    const int keys = static_cast<int>(std::min<std::int64_t>(kKeyChunk, num_rows - chunk));
    for (int k = 0; k < keys; ++k) DecodeRow<FORMAT>(scratch.rows[chunk + k], p.d_qk, k_tile + k * row_len);
    for (std::int64_t h = 0; h < heads; h += kHeadTile) {
      const int tile_heads = static_cast<int>(std::min<std::int64_t>(kHeadTile, heads - h));
      LoadQueries(p, token, head_begin + h, tile_heads, row_len, q_tile);
      WithHeadTile(tile_heads, [&](auto ht) { QkHeads<decltype(ht)::value>(q_tile, row_len, k_tile, keys, scores); });
      SoftmaxChunk(scores, tile_heads, keys, p.softmax_scale, scratch.running_max.data() + h,
                   scratch.running_sum.data() + h, alpha);
      WithHeadTile(tile_heads, [&](auto ht) {
        PvHeads<decltype(ht)::value>(scores, keys, k_tile, row_len, acc + h * acc_len, acc_len, alpha);
      });
    }
  }
  FinishHeads(p, token, head_begin, heads, num_rows == 0, acc, acc_len, scratch.running_max.data(),
              scratch.running_sum.data());
}

void AttendTokenHeads(const AttentionOperands& operands, std::int64_t token, std::int64_t head_begin,
                      std::int64_t head_end) {
  if (operands.source == RowSource::kFlatBf16) {
    Attend<FlatBf16Rows>(operands, token, head_begin, head_end);
    return;
  }
  visit_kv_format(operands.format,
                  [&](auto format) { Attend<decltype(format)>(operands, token, head_begin, head_end); });
}

std::int64_t CurrentTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace smla::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace smla::cpu {

HWY_EXPORT(AttendTokenHeads);
HWY_EXPORT(CurrentTarget);

void attend_token_heads(const detail::AttentionOperands& operands, std::int64_t token, std::int64_t head_begin,
                        std::int64_t head_end) {
  HWY_DYNAMIC_DISPATCH(AttendTokenHeads)(operands, token, head_begin, head_end);
}

std::vector<SimdTarget> available_simd_targets() {
  // Computed before any force_simd_target mock narrows SupportedTargets().
  static const std::vector<SimdTarget> targets = [] {
    std::vector<SimdTarget> result;
    for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) result.push_back({target, hwy::TargetName(target)});
    return result;
  }();
  return targets;
}

void force_simd_target(std::int64_t id) {
  (void)available_simd_targets();
  hwy::SetSupportedTargetsForTest(id);
}

std::string active_simd_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)()); }

}  // namespace smla::cpu
#endif  // HWY_ONCE
