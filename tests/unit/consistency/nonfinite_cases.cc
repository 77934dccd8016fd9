#include "tests/unit/consistency/nonfinite_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>

#include "smla/kv_format.h"
#include "smla/numeric.h"
#include "src/core/kv_rows.h"
#include "testkit/case_util.h"

namespace smla::nonfinite {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::uint16_t kBf16NaN = 0x7FC0;
constexpr std::uint16_t kSentinelBf16 = 0x4640;  // 12288: no backend writes it for these inputs
constexpr float kSentinelF32 = -12345.0f;

using testkit::detail::at;

// ---------------------------------------------------------------------------
// Which rows a token attends (the same rule as every backend: the first
// `length` entries, 0 <= index < rows; duplicates kept).

struct Key {
  int source = 0;  // 0: main, 1: extra (decode); 0 for prefill
  std::int64_t row = 0;
  bool operator==(const Key&) const = default;
};

std::vector<Key> attended_in(const TensorView& indices, const TensorView& lengths, std::int64_t rows, std::int64_t t,
                             int source) {
  std::vector<Key> keys;
  if (!indices.present()) return keys;
  const std::int64_t width = indices.shape[1];
  const std::int64_t length =
      lengths.present() ? std::clamp<std::int64_t>(at<const std::int32_t>(lengths, t), 0, width) : width;
  for (std::int64_t k = 0; k < length; ++k) {
    const std::int64_t index = at<const std::int32_t>(indices, t, k);
    if (index >= 0 && index < rows) keys.push_back({source, index});
  }
  return keys;
}

std::vector<Key> attended(const SparseDecodeArgs& a, std::int64_t t) {
  std::vector<Key> keys = attended_in(a.main_indices, a.main_lengths, a.main_cache.num_slots(), t, 0);
  if (a.extra_cache.has_value()) {
    const std::vector<Key> extra = attended_in(a.extra_indices, a.extra_lengths, a.extra_cache->num_slots(), t, 1);
    keys.insert(keys.end(), extra.begin(), extra.end());
  }
  return keys;
}

std::vector<Key> attended(const SparsePrefillArgs& a, std::int64_t t) {
  return attended_in(a.indices, a.topk_length, a.kv.shape[0], t, 0);
}

bool attends(const std::vector<Key>& keys, const Key& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// ---------------------------------------------------------------------------
// Building blocks.

testkit::DecodeCaseOptions decode_options(const Shape& s, KvFormat format, std::uint64_t seed) {
  testkit::DecodeCaseOptions o;
  o.num_requests = s.num_requests;
  o.s_q = s.s_q;
  o.num_heads = s.num_heads;
  o.format = format;
  o.main_topk = 64;
  o.main_page_size = 16;
  o.main_context = 200;
  o.extra_topk = 96;
  o.extra_page_size = 16;
  o.extra_context = 256;
  o.seed = seed;
  return o;
}

testkit::PrefillCaseOptions prefill_options(const Shape& s, int d_qk, std::uint64_t seed) {
  testkit::PrefillCaseOptions o;
  o.s_q = s.num_requests * s.s_q;
  o.s_kv = 256;
  o.num_heads = s.num_heads;
  o.d_qk = d_qk;
  o.topk = 128;  // two of the sm90 kernel's 64-key tiles: its split launches do split
  o.seed = seed;
  return o;
}

// Row kinds from the index lists alone: kEmpty where nothing is attended.
template <class Args>
void set_default_rows(Case& c, const Args& args) {
  c.rows.assign(static_cast<std::size_t>(c.num_tokens * c.num_heads), RowKind::kFinite);
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    if (!attended(args, t).empty()) continue;
    for (std::int64_t h = 0; h < c.num_heads; ++h) c.row(t, h) = RowKind::kEmpty;
  }
}

Case make_decode(const char* name, const Shape& s, const testkit::DecodeCaseOptions& options) {
  Case c;
  c.name = name;
  c.op = Op::kDecode;
  c.decode.emplace(testkit::make_decode_case(options));
  c.softmax_scale = c.decode->softmax_scale();
  c.num_tokens = c.decode->num_tokens();
  c.num_heads = c.decode->num_heads();
  c.queries_per_request = s.pack ? s.s_q : 1;
  set_default_rows(c, c.decode->args());
  return c;
}

Case make_prefill(const char* name, const testkit::PrefillCaseOptions& options) {
  Case c;
  c.name = name;
  c.op = Op::kPrefill;
  c.prefill.emplace(testkit::make_prefill_case(options));
  c.softmax_scale = c.prefill->softmax_scale();
  c.num_tokens = options.s_q;
  c.num_heads = options.num_heads;
  set_default_rows(c, c.prefill->args());
  return c;
}

// A row of the main cache that every token of request 0 attends (the sliding
// windows of a request's tokens overlap; a packed group is a request's tokens).
std::int64_t shared_main_slot(Case& c) {
  const SparseDecodeArgs a = c.decode->args();
  const std::int64_t s_q = c.decode->options().s_q;
  for (const Key& key : attended(a, 0)) {
    if (key.source != 0) continue;
    bool everyone = true;
    for (std::int64_t t = 1; t < s_q && everyone; ++t) everyone = attends(attended(a, t), key);
    if (everyone) return key.row;
  }
  return -1;
}

// Where a NaN (or an inf scale) is planted in a selected cache row.
enum class Plant { kNopeCode, kRope, kScale, kScaleInf, kValue };

void plant_in_row(const KvCacheView& cache, std::int64_t slot, Plant what) {
  std::int64_t entry = 0;
  std::uint8_t* page = detail::writable_page_of_slot(cache, slot, &entry);
  const std::int64_t ps = cache.page_size();
  switch (cache.format) {
    case KvFormat::kV4Fp8: {
      using F = V4Fp8Format;
      if (what == Plant::kNopeCode) page[F::nope_offset(entry, ps) + 100] = 0x7F;  // e4m3 NaN
      if (what == Plant::kRope) std::memcpy(page + F::rope_offset(entry, ps) + 2 * 10, &kBf16NaN, 2);
      if (what == Plant::kScale) page[F::scale_offset(entry, ps) + 3] = 0xFF;  // UE8M0 NaN
      break;
    }
    case KvFormat::kV32Fp8: {
      using F = V32Fp8Format;
      if (what == Plant::kNopeCode) page[F::nope_offset(entry, ps) + 300] = 0xFF;  // e4m3 NaN, sign set
      if (what == Plant::kRope) std::memcpy(page + F::rope_offset(entry, ps) + 2 * 5, &kBf16NaN, 2);
      if (what == Plant::kScale) std::memcpy(page + F::scale_offset(entry, ps) + 4 * 2, &kNaN, 4);
      if (what == Plant::kScaleInf) {
        // inf x the tile's codes: a zero code gives 0 x inf = NaN, so the row holds a NaN value.
        std::memcpy(page + F::scale_offset(entry, ps) + 4 * 1, &kInf, 4);
        page[F::nope_offset(entry, ps) + 130] = 0x00;
      }
      break;
    }
    case KvFormat::kBf16Rows:
      std::memcpy(page + entry * Bf16RowsFormat::kBytesPerToken + 2 * 200, &kBf16NaN, 2);
      break;
    case KvFormat::kFp8Rows:
      page[entry * Fp8RowsFormat::kBytesPerToken + 200] = 0x7F;
      break;
  }
}

// Plants a NaN in a main-cache row every token of request 0 attends; every token
// attending that row (duplicates or other requests included) becomes a NaN row.
void plant_shared_row(Case& c, Plant what) {
  c.must_occur.push_back(RowKind::kNan);
  const std::int64_t slot = shared_main_slot(c);
  if (slot < 0) return;  // no such row: the semantics check still holds (nothing planted)
  const SparseDecodeArgs a = c.decode->args();
  plant_in_row(a.main_cache, slot, what);
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    if (!attends(attended(a, t), Key{0, slot})) continue;
    for (std::int64_t h = 0; h < c.num_heads; ++h) c.row(t, h) = RowKind::kNan;
  }
}

// NaN in q[t, h, d] for a few rows: only those rows (never their neighbours) go NaN.
template <class Args>
void nan_queries(Case& c, const Args& a, const std::vector<std::array<std::int64_t, 3>>& where) {
  c.must_occur.push_back(RowKind::kNan);
  for (const auto& [t, h, d] : where) {
    if (t >= c.num_tokens || h >= c.num_heads) continue;
    at<std::uint16_t>(a.q, t, h, d) = kBf16NaN;
    if (c.row(t, h) != RowKind::kEmpty) c.row(t, h) = RowKind::kNan;
  }
}

// Sinks NaN / +inf / -inf on heads 0 / 1 / 2 (the rest keep the case's values).
template <class Args>
void special_sinks(Case& c, const Args& a) {
  c.must_occur.push_back(RowKind::kNanOut);
  c.must_occur.push_back(RowKind::kZeroOut);
  at<float>(a.sink, 0) = kNaN;
  at<float>(a.sink, 1) = kInf;
  at<float>(a.sink, 2) = -kInf;
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    if (c.row(t, 0) == RowKind::kFinite) c.row(t, 0) = RowKind::kNanOut;
    if (c.row(t, 1) == RowKind::kFinite) c.row(t, 1) = RowKind::kZeroOut;
  }
}

// Logits past f32: q = 64 e_d (one dimension, d < 448 so every format's NoPE
// part), a different d per row. Scores are then single exact products 64 k_d:
// every backend orders them alike, equal codes tie exactly, and the softmax is
// the mean of the values of the keys with the largest k_d (scale 1e30 and 1e37
// both leave no weight elsewhere). The sink pattern of special_sinks plus one
// finite sink keeps working at that scale (its weight e^(sink - scale m) is 0).
template <class Args>
void scaled_beyond_f32(Case& c, const Args& a, float scale, bool with_sink) {
  c.softmax_scale = scale;
  c.has_sink = with_sink;
  c.stats_may_overflow = true;
  if (with_sink) special_sinks(c, a);
  const std::int64_t d_qk = a.q.shape[2];
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    for (std::int64_t h = 0; h < c.num_heads; ++h) {
      for (std::int64_t d = 0; d < d_qk; ++d) at<std::uint16_t>(a.q, t, h, d) = 0;
      at<std::uint16_t>(a.q, t, h, (7 * h + 3 * t) % 448) = f32_to_bf16(64.0f);
      if (c.row(t, h) == RowKind::kFinite) c.row(t, h) = RowKind::kScaled;
    }
  }
  c.expect_lse_overflow = scale >= 1e37f;
  c.must_occur.push_back(RowKind::kScaled);
}

// ---------------------------------------------------------------------------
// The table.

Case no_leak(const Shape& s, std::uint64_t seed) {
  testkit::DecodeCaseOptions o = decode_options(s, KvFormat::kV4Fp8, seed);
  o.random_lengths = true;  // rows past the lengths hold NaN poison
  o.invalid_index_fraction = 0.2;  // so do the rows out-of-range entries would name
  return make_decode("nan in unselected rows only (must not leak)", s, o);
}

template <KvFormat kFormat, Plant kWhat>
Case row_nan(const Shape& s, std::uint64_t seed) {
  static const std::string name = fmt::format("{}: {} in a selected row", kv_format_name(kFormat),
                                              kWhat == Plant::kNopeCode  ? "e4m3 NaN code"
                                              : kWhat == Plant::kRope    ? "bf16 NaN in the RoPE part"
                                              : kWhat == Plant::kScale   ? "NaN scale"
                                              : kWhat == Plant::kScaleInf ? "inf scale (0 x inf = NaN value)"
                                                                          : "NaN value");
  Case c = make_decode(name.c_str(), s, decode_options(s, kFormat, seed));
  plant_shared_row(c, kWhat);
  return c;
}

Case q_nan(const Shape& s, std::uint64_t seed) {
  Case c = make_decode("NaN in q of some heads", s, decode_options(s, KvFormat::kV4Fp8, seed));
  const SparseDecodeArgs a = c.decode->args();
  nan_queries(c, a, {{0, 1, 5}, {0, 3, 500}, {c.num_tokens - 1, 0, 0}});
  return c;
}

Case sinks(const Shape& s, std::uint64_t seed) {
  Case c = make_decode("sinks NaN, +inf, -inf", s, decode_options(s, KvFormat::kV4Fp8, seed));
  special_sinks(c, c.decode->args());
  return c;
}

Case empty_rows(const Shape& s, std::uint64_t seed) {
  Case c = make_decode("empty rows with NaN q and NaN sink", s, decode_options(s, KvFormat::kV4Fp8, seed));
  const SparseDecodeArgs a = c.decode->args();
  at<std::int32_t>(a.main_lengths, 0) = 0;  // token 0 attends nothing
  at<std::int32_t>(a.extra_lengths, 0) = 0;
  c.must_occur.push_back(RowKind::kEmpty);
  for (std::int64_t h = 0; h < c.num_heads; ++h) {
    c.row(0, h) = RowKind::kEmpty;
    at<std::uint16_t>(a.q, 0, h, 7) = kBf16NaN;  // never multiplies anything
  }
  special_sinks(c, a);  // token 0 stays empty whatever the sink
  return c;
}

template <int kScaleExponent, bool kSink>
Case decode_scaled(const Shape& s, std::uint64_t seed) {
  static const std::string name = fmt::format("v4-fp8: softmax_scale 1e{} {}", kScaleExponent,
                                              kSink ? "with NaN/+inf/-inf/finite sinks" : "without sink");
  Case c = make_decode(name.c_str(), s, decode_options(s, KvFormat::kV4Fp8, seed));
  scaled_beyond_f32(c, c.decode->args(), static_cast<float>(std::pow(10.0, kScaleExponent)), kSink);
  return c;
}

template <int kDim>
Case prefill_row_nan(const Shape& s, std::uint64_t seed) {
  static const std::string name = fmt::format("prefill d{}: bf16 NaN in a selected row ({})", kDim,
                                              kDim == 576 ? "RoPE part" : "value part");
  Case c = make_prefill(name.c_str(), prefill_options(s, kDim, seed));
  const SparsePrefillArgs a = c.prefill->args();
  c.must_occur.push_back(RowKind::kNan);
  // The first row some query attends; every query attending it goes NaN.
  std::int64_t row = -1;
  for (std::int64_t t = 0; t < c.num_tokens && row < 0; ++t) {
    const std::vector<Key> keys = attended(a, t);
    if (!keys.empty()) row = keys.front().row;
  }
  if (row < 0) return c;
  at<std::uint16_t>(a.kv, row, kDim == 576 ? 540 : 17) = kBf16NaN;
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    if (!attends(attended(a, t), Key{0, row})) continue;
    for (std::int64_t h = 0; h < c.num_heads; ++h) c.row(t, h) = RowKind::kNan;
  }
  return c;
}

Case prefill_q_nan_and_sinks(const Shape& s, std::uint64_t seed) {
  Case c = make_prefill("prefill d512: NaN q rows and NaN/+inf/-inf sinks", prefill_options(s, 512, seed));
  const SparsePrefillArgs a = c.prefill->args();
  special_sinks(c, a);
  nan_queries(c, a, {{0, 3, 9}, {c.num_tokens - 1, 2, 300}, {c.num_tokens / 2, 0, 0}});
  return c;
}

template <int kScaleExponent, bool kSink>
Case prefill_scaled(const Shape& s, std::uint64_t seed) {
  static const std::string name = fmt::format("prefill d576: softmax_scale 1e{} {}", kScaleExponent,
                                              kSink ? "with NaN/+inf/-inf/finite sinks" : "without sink");
  Case c = make_prefill(name.c_str(), prefill_options(s, 576, seed));
  scaled_beyond_f32(c, c.prefill->args(), static_cast<float>(std::pow(10.0, kScaleExponent)), kSink);
  return c;
}

bool all_of_out(const TensorView& out, std::int64_t t, std::int64_t h, bool (*pred)(float)) {
  for (std::int64_t d = 0; d < out.shape[2]; ++d) {
    if (!pred(bf16_to_f32(at<const std::uint16_t>(out, t, h, d)))) return false;
  }
  return true;
}

}  // namespace

void PrintTo(const CaseSpec& spec, std::ostream* os) { *os << spec.name; }

const char* row_kind_name(RowKind kind) {
  switch (kind) {
    case RowKind::kFinite: return "finite";
    case RowKind::kNan: return "NaN row";
    case RowKind::kNanOut: return "NaN out, finite lse";
    case RowKind::kZeroOut: return "zero out, finite lse";
    case RowKind::kEmpty: return "empty";
    case RowKind::kScaled: return "beyond-f32 scale";
  }
  return "?";
}

std::string Shape::name() const {
  return fmt::format("{} requests x s_q {}, h {}{}", num_requests, s_q, num_heads, pack ? ", packed" : "");
}

const std::vector<CaseSpec>& cases() {
  static const std::vector<CaseSpec> table = {
      {"no_leak", Op::kDecode, true, no_leak},
      {"v4_nope_nan_code", Op::kDecode, true, row_nan<KvFormat::kV4Fp8, Plant::kNopeCode>},
      {"v4_rope_bf16_nan", Op::kDecode, true, row_nan<KvFormat::kV4Fp8, Plant::kRope>},
      {"v4_scale_byte_ff", Op::kDecode, true, row_nan<KvFormat::kV4Fp8, Plant::kScale>},
      {"v32_nope_nan_code", Op::kDecode, true, row_nan<KvFormat::kV32Fp8, Plant::kNopeCode>},
      {"v32_rope_bf16_nan", Op::kDecode, true, row_nan<KvFormat::kV32Fp8, Plant::kRope>},
      {"v32_scale_nan", Op::kDecode, true, row_nan<KvFormat::kV32Fp8, Plant::kScale>},
      {"v32_scale_inf", Op::kDecode, true, row_nan<KvFormat::kV32Fp8, Plant::kScaleInf>},
      {"bf16_rows_nan", Op::kDecode, true, row_nan<KvFormat::kBf16Rows, Plant::kValue>},
      {"fp8_rows_nan_code", Op::kDecode, true, row_nan<KvFormat::kFp8Rows, Plant::kValue>},
      {"q_nan_some_heads", Op::kDecode, true, q_nan},
      {"sinks_nan_inf", Op::kDecode, true, sinks},
      {"empty_rows_nan_q_sink", Op::kDecode, true, empty_rows},
      {"scale_1e37_sinks", Op::kDecode, true, decode_scaled<37, true>},
      {"scale_1e37_no_sink", Op::kDecode, true, decode_scaled<37, false>},
      {"scale_1e30_sinks", Op::kDecode, true, decode_scaled<30, true>},
      {"scale_1e30_no_sink", Op::kDecode, true, decode_scaled<30, false>},
      {"prefill_d512_row_nan", Op::kPrefill, false, prefill_row_nan<512>},
      {"prefill_d576_rope_nan", Op::kPrefill, false, prefill_row_nan<576>},
      {"prefill_q_nan_sinks", Op::kPrefill, false, prefill_q_nan_and_sinks},
      {"prefill_scale_1e37_sinks", Op::kPrefill, false, prefill_scaled<37, true>},
      {"prefill_scale_1e37_no_sink", Op::kPrefill, false, prefill_scaled<37, false>},
      {"prefill_scale_1e30_sinks", Op::kPrefill, false, prefill_scaled<30, true>},
  };
  return table;
}

Outputs make_outputs(const Case& c) {
  Outputs o;
  if (c.op == Op::kDecode) {
    o.out = c.decode->make_out();
    o.lse = c.decode->make_lse();
  } else {
    o.out = c.prefill->make_out();
    o.lse = c.prefill->make_lse();
    o.max_logits = c.prefill->make_max_logits();
  }
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    for (std::int64_t h = 0; h < c.num_heads; ++h) {
      for (std::int64_t d = 0; d < o.out.view().shape[2]; ++d) at<std::uint16_t>(o.out.view(), t, h, d) = kSentinelBf16;
      at<float>(o.lse.view(), t, h) = kSentinelF32;
      if (o.max_logits.present()) at<float>(o.max_logits.view(), t, h) = kSentinelF32;
    }
  }
  return o;
}

SparseDecodeArgs decode_args(Case& c, const Outputs& outputs) {
  SparseDecodeArgs a = c.decode->args_with_outputs(outputs.out.view(), outputs.lse.view());
  a.softmax_scale = c.softmax_scale;
  if (!c.has_sink) a.sink = TensorView{};
  a.queries_per_request = c.queries_per_request;
  return a;
}

SparsePrefillArgs prefill_args(Case& c, const Outputs& outputs) {
  SparsePrefillArgs a =
      c.prefill->args_with_outputs(outputs.out.view(), outputs.max_logits.view(), outputs.lse.view());
  a.softmax_scale = c.softmax_scale;
  if (!c.has_sink) a.sink = TensorView{};
  return a;
}

Status run_host(Case& c, Backend backend, Outputs* outputs) {
  *outputs = make_outputs(c);
  if (c.op == Op::kDecode) return sparse_decode(decode_args(c, *outputs), backend);
  return sparse_prefill(prefill_args(c, *outputs), backend);
}

std::string check_semantics(const Case& c, const Outputs& reference) {
  const TensorView& out = reference.out.view();
  std::string problems;
  int reported = 0;
  bool lse_overflowed = false;
  auto is_nan = [](float x) { return std::isnan(x); };
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    for (std::int64_t h = 0; h < c.num_heads; ++h) {
      const RowKind kind = c.row(t, h);
      const float lse = at<const float>(reference.lse.view(), t, h);
      const float max_logit = reference.max_logits.present() ? at<const float>(reference.max_logits.view(), t, h) : 0.0f;
      const bool has_max = reference.max_logits.present();
      // lse / max_logits of an attended row: finite, or +inf where the case scales logits past f32.
      // (A row whose keys all score below 0 has lse far below any finite sink: out 0, lse
      // finite or, past -FLT_MAX, -inf.)
      auto stat_ok = [&](float x) { return std::isfinite(x) || (c.stats_may_overflow && std::isinf(x)); };
      bool ok = false;
      switch (kind) {
        case RowKind::kFinite:
          ok = all_of_out(out, t, h, [](float x) { return std::isfinite(x); }) && stat_ok(lse) &&
               (!has_max || stat_ok(max_logit));
          break;
        case RowKind::kNan:
          ok = all_of_out(out, t, h, is_nan) && std::isnan(lse) && (!has_max || std::isnan(max_logit));
          break;
        case RowKind::kNanOut:
          ok = all_of_out(out, t, h, is_nan) && stat_ok(lse) && (!has_max || stat_ok(max_logit));
          break;
        case RowKind::kZeroOut:
          ok = all_of_out(out, t, h, [](float x) { return x == 0.0f; }) && stat_ok(lse) &&
               (!has_max || stat_ok(max_logit));
          break;
        case RowKind::kEmpty:
          ok = all_of_out(out, t, h, [](float x) { return x == 0.0f; }) && lse == kInf && (!has_max || max_logit == -kInf);
          break;
        case RowKind::kScaled:
          ok = all_of_out(out, t, h, [](float x) { return std::isfinite(x); }) &&
               (c.has_sink || !all_of_out(out, t, h, [](float x) { return x == 0.0f; })) && stat_ok(lse) &&
               (!has_max || stat_ok(max_logit));
          lse_overflowed = lse_overflowed || lse == kInf;
          break;
      }
      if (!ok && reported++ < 5) {
        problems += fmt::format("row (t {}, h {}) should be {}: lse {} max_logit {} out[0] {}\n", t, h,
                                row_kind_name(kind), lse, max_logit, bf16_to_f32(at<const std::uint16_t>(out, t, h, 0)));
      }
    }
  }
  if (c.expect_lse_overflow && !lse_overflowed) problems += "no row's lse overflowed to +inf\n";
  for (const RowKind kind : c.must_occur) {
    if (std::find(c.rows.begin(), c.rows.end(), kind) == c.rows.end()) {
      problems += fmt::format("the case has no {} row (its planting missed)\n", row_kind_name(kind));
    }
  }
  return problems;
}

std::string compare(const Case& c, const Outputs& got, const Outputs& want, const Tolerances& tolerances) {
  std::string problems;
  auto add = [&](const testkit::ErrorStats& stats, const char* what) {
    if (!stats.passed()) problems += fmt::format("{}: {}\n", what, stats.to_string());
  };
  add(testkit::compare_bf16(got.out.view(), want.out.view(), tolerances.out), "out");
  add(testkit::compare_f32(got.lse.view(), want.lse.view(), tolerances.stat), "lse");
  if (c.op == Op::kPrefill) add(testkit::compare_f32(got.max_logits.view(), want.max_logits.view(), tolerances.stat), "max_logits");
  return problems;
}

}  // namespace smla::nonfinite
