#include "testkit/decode_case.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "smla/codec.h"
#include "src/core/kv_rows.h"
#include "testkit/case_util.h"
#include "testkit/compare.h"

namespace smla::testkit {

namespace {

using detail::at;
using detail::Rng;

constexpr std::int64_t kMaxHeads = 128;
// Extra elements per padded stride when options.strided is set.
constexpr std::int64_t kHeadPad = 16;
constexpr std::int64_t kTokenPad = 8;
constexpr std::int64_t kIndexPad = 5;
constexpr std::int64_t kLsePad = 3;
constexpr std::int64_t kPagePadBytes = 64;
// Spare physical pages per cache that no block table maps (always poisoned).
constexpr std::int64_t kSparePages = 2;

DecodeCaseOptions clamped(DecodeCaseOptions o) {
  o.num_requests = std::max<std::int64_t>(o.num_requests, 1);
  o.s_q = std::max(o.s_q, 1);
  o.num_heads = std::clamp<std::int64_t>(o.num_heads, 1, kMaxHeads);
  o.main_topk = std::max<std::int64_t>(o.main_topk, 1);
  o.main_page_size = std::max<std::int64_t>(o.main_page_size, 1);
  o.main_context = std::max<std::int64_t>(o.main_context, o.s_q);
  o.extra_topk = std::max<std::int64_t>(o.extra_topk, 0);
  o.extra_page_size = std::max<std::int64_t>(o.extra_page_size, 1);
  o.extra_context = std::max<std::int64_t>(o.extra_context, 1);
  o.invalid_index_fraction = std::clamp(o.invalid_index_fraction, 0.0, 1.0);
  if (!(o.value_scale > 0.0 && std::isfinite(o.value_scale))) o.value_scale = 1.0;
  return o;
}

// Which logical blocks each request uses, and where they live physically.
struct PagedLayout {
  std::int64_t page_size = 1;
  std::int64_t num_pages = 0;
  std::vector<std::vector<std::int64_t>> block_table;  // [request][logical block] -> page or -1

  std::int64_t slot(std::int64_t request, std::int64_t position) const {
    const auto& table = block_table[static_cast<std::size_t>(request)];
    return table[static_cast<std::size_t>(position / page_size)] * page_size + position % page_size;
  }
};

// Maps every touched logical block of every request to a distinct physical
// page, in a random order shared across requests, with spare pages mixed in.
PagedLayout make_layout(const std::vector<std::vector<bool>>& touched, std::int64_t page_size, Rng& rng) {
  PagedLayout layout;
  layout.page_size = page_size;
  std::int64_t used = 0;
  for (const auto& blocks : touched) used += std::count(blocks.begin(), blocks.end(), true);
  layout.num_pages = used + kSparePages;
  const std::vector<std::int64_t> order = detail::distinct_sample(rng, layout.num_pages, layout.num_pages);
  std::size_t next = 0;
  for (const auto& blocks : touched) {
    std::vector<std::int64_t> table(blocks.size(), -1);
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b]) table[b] = order[next++];
    }
    layout.block_table.push_back(std::move(table));
  }
  return layout;
}

// Writes a NaN pattern in every field of every row (0x7F e4m3 codes, 0xFF
// scales, NaN bf16) and 0xFF in page padding.
template <class Format>
void poison_cache(const KvCacheView& cache) {
  auto* base = static_cast<std::uint8_t*>(cache.pages.data);
  const std::int64_t stride = cache.page_stride_bytes();
  std::memset(
      base, 0xFF,
      static_cast<std::size_t>(stride * (cache.num_pages() - 1) + Format::page_content_bytes(cache.page_size())));
  const std::uint16_t nan_bf16 = 0x7FC0;
  for (std::int64_t p = 0; p < cache.num_pages(); ++p) {
    std::uint8_t* page = base + p * stride;
    for (std::int64_t t = 0; t < cache.page_size(); ++t) {
      if constexpr (Format::kLayout == KvRowLayout::kTiledNopeRope) {
        std::memset(page + Format::nope_offset(t, cache.page_size()), 0x7F, Format::kNopeDim);
        std::memset(page + Format::scale_offset(t, cache.page_size()), 0xFF, Format::kScaleBytes);
        for (int i = 0; i < Format::kRopeDim; ++i) {
          ::smla::detail::store_u16(page + Format::rope_offset(t, cache.page_size()) + 2 * i, nan_bf16);
        }
      } else if constexpr (Format::kStorage == DType::kBF16) {
        for (int i = 0; i < Format::kHeadDim; ++i) {
          ::smla::detail::store_u16(page + t * Format::kBytesPerToken + 2 * i, nan_bf16);
        }
      } else {
        std::memset(page + t * Format::kBytesPerToken, 0x7F, Format::kBytesPerToken);
      }
    }
  }
}

// Random rows ~ N(0, sigma^2) written at `slots`, through the public
// quantizer when it is available and the row codec otherwise.
void write_random_rows(const KvCacheView& cache, const std::vector<std::int64_t>& slots, Rng& rng, double sigma) {
  if (slots.empty()) return;
  const int head_dim = kv_format_info(cache.format).head_dim;
  const auto n = static_cast<std::int64_t>(slots.size());
  std::vector<float> rows(static_cast<std::size_t>(n * head_dim));
  detail::BulkNormal normal(rng);
  for (float& v : rows) v = normal.next(sigma);
  std::vector<std::int64_t> slot_copy = slots;
  const TensorView rows_view = TensorView::contiguous(rows.data(), DType::kF32, {n, head_dim});
  const TensorView slots_view = TensorView::contiguous(slot_copy.data(), DType::kI64, {n});
  if (quantize_into_cache(cache, rows_view, slots_view).ok()) return;
  visit_kv_format(cache.format, [&](auto traits) {
    using Format = decltype(traits);
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t entry = 0;
      auto* page =
          const_cast<std::uint8_t*>(::smla::detail::page_of_slot(cache, slots[static_cast<std::size_t>(i)], &entry));
      ::smla::detail::encode_token<Format>(rows.data() + i * head_dim, page, cache.page_size(), entry, cache.fp8_scale);
    }
  });
}

HostTensor make_pages(KvFormat format, std::int64_t num_pages, std::int64_t page_size, bool padded) {
  const KvFormatInfo info = kv_format_info(format);
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(info.storage_dtype));
  const std::int64_t page_bytes =
      visit_kv_format(format, [&](auto traits) { return decltype(traits)::page_bytes(page_size); }) +
      (padded ? kPagePadBytes : 0);
  return HostTensor::zeros(info.storage_dtype, {num_pages, page_size, info.row_elements},
                           {page_bytes / element, info.row_elements, 1});
}

struct IndexSet {
  HostTensor indices;  // [T, width] i32
  HostTensor lengths;  // [T] i32
};

IndexSet make_index_tensors(std::int64_t num_tokens, std::int64_t width, bool strided) {
  IndexSet set;
  set.indices = HostTensor::zeros(DType::kI32, {num_tokens, width}, {strided ? width + kIndexPad : width, 1});
  set.lengths = HostTensor::zeros(DType::kI32, {num_tokens});
  return set;
}

// Per token: logical positions (or -1) of one index set, and its length.
struct LogicalIndices {
  std::vector<std::vector<std::int64_t>> positions;  // [T][width]
  std::vector<std::int64_t> lengths;                 // [T]
};

// Fills the tensors from logical positions mapped through the request's
// block table, then plants invalid values and records the attended slots.
void materialize(const LogicalIndices& logical, const PagedLayout& layout, const DecodeCaseOptions& o,
                 const IndexSet& set, Rng& rng, std::vector<bool>& attended_slots, std::int64_t& attended) {
  const std::int64_t num_slots = layout.num_pages * layout.page_size;
  const TensorView& idx = set.indices.view();
  for (std::size_t t = 0; t < logical.positions.size(); ++t) {
    const std::int64_t request = static_cast<std::int64_t>(t) / o.s_q;
    const std::int64_t length = logical.lengths[t];
    at<std::int32_t>(set.lengths.view(), static_cast<std::int64_t>(t)) = static_cast<std::int32_t>(length);
    for (std::size_t k = 0; k < logical.positions[t].size(); ++k) {
      const std::int64_t position = logical.positions[t][k];
      std::int32_t value = position < 0 ? -1 : static_cast<std::int32_t>(layout.slot(request, position));
      const bool in_length = static_cast<std::int64_t>(k) < length;
      if (in_length && value >= 0 && detail::random_bernoulli(rng, o.invalid_index_fraction)) {
        value = detail::random_invalid_index(rng, num_slots);
      }
      at<std::int32_t>(idx, static_cast<std::int64_t>(t), static_cast<std::int64_t>(k)) = value;
      if (in_length && value >= 0 && value < num_slots) {
        attended_slots[static_cast<std::size_t>(value)] = true;
        ++attended;
      }
    }
  }
}

std::int64_t pick_length(Rng& rng, const DecodeCaseOptions& o, std::int64_t width, std::int64_t filled) {
  return o.random_lengths ? detail::random_int(rng, 0, width) : filled;
}

void fill_cache(const KvCacheView& cache, const std::vector<bool>& attended_slots, const DecodeCaseOptions& o,
                Rng& rng) {
  std::vector<std::int64_t> slots;
  if (o.poison_unselected) {
    visit_kv_format(cache.format, [&](auto traits) { poison_cache<decltype(traits)>(cache); });
  }
  for (std::size_t s = 0; s < attended_slots.size(); ++s) {
    if (attended_slots[s] || !o.poison_unselected) slots.push_back(static_cast<std::int64_t>(s));
  }
  write_random_rows(cache, slots, rng, o.value_scale);
}

}  // namespace

Status check_decode_case_options(const DecodeCaseOptions& o) {
  if (o.num_requests < 1) return invalid_argument("num_requests", ">= 1", fmt::format("{}", o.num_requests));
  if (o.s_q < 1) return invalid_argument("s_q", ">= 1", fmt::format("{}", o.s_q));
  if (o.num_heads < 1 || o.num_heads > kMaxHeads) {
    return invalid_argument("num_heads", "in [1, 128]", fmt::format("{}", o.num_heads));
  }
  if (o.main_topk < 1) return invalid_argument("main_topk", ">= 1", fmt::format("{}", o.main_topk));
  if (o.main_page_size < 1) return invalid_argument("main_page_size", ">= 1", fmt::format("{}", o.main_page_size));
  if (o.main_context < o.s_q) {
    return invalid_argument("main_context", fmt::format(">= s_q ({})", o.s_q), fmt::format("{}", o.main_context));
  }
  if (o.extra_topk < 0) return invalid_argument("extra_topk", ">= 0", fmt::format("{}", o.extra_topk));
  if (o.extra_topk > 0 && o.extra_page_size < 1) {
    return invalid_argument("extra_page_size", ">= 1", fmt::format("{}", o.extra_page_size));
  }
  if (o.extra_topk > 0 && o.extra_context < 1) {
    return invalid_argument("extra_context", ">= 1", fmt::format("{}", o.extra_context));
  }
  if (!(o.invalid_index_fraction >= 0.0 && o.invalid_index_fraction <= 1.0)) {
    return invalid_argument("invalid_index_fraction", "in [0, 1]", fmt::format("{}", o.invalid_index_fraction));
  }
  if (!(o.value_scale > 0.0 && std::isfinite(o.value_scale))) {
    return invalid_argument("value_scale", "finite > 0", fmt::format("{}", o.value_scale));
  }
  return Status::Ok();
}

int DecodeCase::d_qk() const { return kv_format_info(options_.format).head_dim; }
int DecodeCase::d_v() const { return kv_format_info(options_.format).value_dim; }

std::int64_t DecodeCase::attended_kv_bytes() const {
  return attended_entries_ * kv_format_info(options_.format).bytes_per_token;
}

HostTensor DecodeCase::make_out() const {
  const TensorView& v = out_.view();
  return HostTensor::zeros(DType::kBF16, {v.shape[0], v.shape[1], v.shape[2]}, {v.stride[0], v.stride[1], v.stride[2]});
}

HostTensor DecodeCase::make_lse() const {
  const TensorView& v = lse_.view();
  return HostTensor::zeros(DType::kF32, {v.shape[0], v.shape[1]}, {v.stride[0], v.stride[1]});
}

SparseDecodeArgs DecodeCase::args_with_outputs(const TensorView& out, const TensorView& lse) const {
  SparseDecodeArgs a;
  a.q = q_.view();
  a.main_cache = KvCacheView{main_pages_.view(), options_.format, fp8_scale_};
  a.main_indices = main_indices_.view();
  a.main_lengths = main_lengths_.view();
  if (extra_pages_.present()) {
    a.extra_cache = KvCacheView{extra_pages_.view(), options_.format, fp8_scale_};
    a.extra_indices = extra_indices_.view();
    a.extra_lengths = extra_lengths_.view();
  }
  a.sink = sink_.view();
  a.softmax_scale = softmax_scale_;
  a.out = out;
  a.lse = lse;
  return a;
}

void DecodeCase::poison_outputs() {
  poison(out_.view());
  poison(lse_.view());
}

SparseDecodeArgs DecodeCase::args() {
  poison_outputs();
  return args_with_outputs(out_.view(), lse_.view());
}

DecodeCase make_decode_case(const DecodeCaseOptions& options) {
  const DecodeCaseOptions o = clamped(options);
  Rng rng(o.seed);
  const KvFormatInfo info = kv_format_info(o.format);
  DecodeCase c;
  c.options_ = o;
  c.num_tokens_ = o.num_requests * o.s_q;
  c.softmax_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(info.head_dim)));
  // Per-tensor scale of the plain fp8 rows: N(0, sigma) values keep ~7 sigma of range.
  c.fp8_scale_ = info.per_tensor_scale ? static_cast<float>(o.value_scale / 64.0) : 1.0f;
  const std::int64_t T = c.num_tokens_;
  const std::int64_t H = o.num_heads;

  // Main (sliding-window) index set: token j of a request sits at position
  // main_context - s_q + j and attends the W positions ending at itself.
  LogicalIndices main_logical;
  std::vector<std::vector<bool>> main_touched(
      static_cast<std::size_t>(o.num_requests),
      std::vector<bool>(static_cast<std::size_t>((o.main_context + o.main_page_size - 1) / o.main_page_size)));
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t request = t / o.s_q;
    const std::int64_t position = o.main_context - o.s_q + t % o.s_q;
    const std::int64_t first = std::max<std::int64_t>(0, position - o.main_topk + 1);
    std::vector<std::int64_t> row(static_cast<std::size_t>(o.main_topk), -1);
    for (std::int64_t p = first; p <= position; ++p) {
      row[static_cast<std::size_t>(p - first)] = p;
      main_touched[static_cast<std::size_t>(request)][static_cast<std::size_t>(p / o.main_page_size)] = true;
    }
    main_logical.positions.push_back(std::move(row));
    main_logical.lengths.push_back(pick_length(rng, o, o.main_topk, position - first + 1));
  }
  const PagedLayout main_layout = make_layout(main_touched, o.main_page_size, rng);

  // Extra (compressed) index set: distinct random entries of the request's compressed context.
  LogicalIndices extra_logical;
  std::vector<std::vector<bool>> extra_touched(
      static_cast<std::size_t>(o.num_requests),
      std::vector<bool>(static_cast<std::size_t>((o.extra_context + o.extra_page_size - 1) / o.extra_page_size)));
  if (o.extra_topk > 0) {
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t request = t / o.s_q;
      const std::int64_t count = std::min(o.extra_topk, o.extra_context);
      std::vector<std::int64_t> row = detail::distinct_sample(rng, o.extra_context, count);
      for (std::int64_t p : row) {
        extra_touched[static_cast<std::size_t>(request)][static_cast<std::size_t>(p / o.extra_page_size)] = true;
      }
      row.resize(static_cast<std::size_t>(o.extra_topk), -1);
      extra_logical.positions.push_back(std::move(row));
      extra_logical.lengths.push_back(pick_length(rng, o, o.extra_topk, count));
    }
  }

  // Indices, lengths and the attended slots.
  IndexSet main_set = make_index_tensors(T, o.main_topk, o.strided);
  c.main_pages_ = make_pages(o.format, main_layout.num_pages, o.main_page_size, o.strided);
  std::vector<bool> main_attended(static_cast<std::size_t>(main_layout.num_pages * o.main_page_size));
  materialize(main_logical, main_layout, o, main_set, rng, main_attended, c.attended_entries_);
  fill_cache(KvCacheView{c.main_pages_.view(), o.format, c.fp8_scale_}, main_attended, o, rng);
  c.main_indices_ = std::move(main_set.indices);
  c.main_lengths_ = std::move(main_set.lengths);

  if (o.extra_topk > 0) {
    const PagedLayout extra_layout = make_layout(extra_touched, o.extra_page_size, rng);
    IndexSet extra_set = make_index_tensors(T, o.extra_topk, o.strided);
    c.extra_pages_ = make_pages(o.format, extra_layout.num_pages, o.extra_page_size, o.strided);
    std::vector<bool> extra_attended(static_cast<std::size_t>(extra_layout.num_pages * o.extra_page_size));
    materialize(extra_logical, extra_layout, o, extra_set, rng, extra_attended, c.attended_entries_);
    fill_cache(KvCacheView{c.extra_pages_.view(), o.format, c.fp8_scale_}, extra_attended, o, rng);
    c.extra_indices_ = std::move(extra_set.indices);
    c.extra_lengths_ = std::move(extra_set.lengths);
  }

  // q (head stride padded when strided; padding holds NaN so reading it shows).
  const std::int64_t d_qk = info.head_dim;
  const std::int64_t q_head_pad = o.q_head_pad >= 0 ? o.q_head_pad : (o.strided ? kHeadPad : 0);
  const std::int64_t q_head_stride = d_qk + q_head_pad;
  c.q_ = HostTensor::zeros(DType::kBF16, {T, H, d_qk},
                           {H * q_head_stride + (o.strided ? kTokenPad : 0), q_head_stride, 1});
  if (q_head_pad > 0 || o.strided) std::memset(c.q_.bytes(), 0xFF, c.q_.size_bytes());
  detail::fill_bf16_normal(c.q_.view(), rng, o.value_scale);

  c.sink_ = HostTensor::zeros(DType::kF32, {H});
  if (o.sink) {
    detail::fill_sink(c.sink_.view(), rng);
  } else {
    c.sink_ = HostTensor{};
  }

  const std::int64_t d_v = info.value_dim;
  const std::int64_t out_head_stride = o.strided ? d_v + kHeadPad : d_v;
  c.out_ = HostTensor::zeros(DType::kBF16, {T, H, d_v},
                             {H * out_head_stride + (o.strided ? kTokenPad : 0), out_head_stride, 1});
  c.lse_ = HostTensor::zeros(DType::kF32, {T, H}, {o.strided ? H + kLsePad : H, 1});
  c.poison_outputs();
  return c;
}

}  // namespace smla::testkit
