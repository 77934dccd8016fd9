#include "testkit/prefill_case.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "testkit/case_util.h"
#include "testkit/compare.h"

namespace smla::testkit {

namespace {

using detail::at;
using detail::Rng;

constexpr std::int64_t kMaxHeads = 128;
constexpr std::int64_t kRowPad = 32;
constexpr std::int64_t kIndexPad = 3;
constexpr std::int64_t kStatPad = 5;

PrefillCaseOptions clamped(PrefillCaseOptions o) {
  o.s_q = std::max<std::int64_t>(o.s_q, 1);
  o.s_kv = std::max<std::int64_t>(o.s_kv, 1);
  o.num_heads = std::clamp<std::int64_t>(o.num_heads, 1, kMaxHeads);
  o.d_qk = std::max(o.d_qk, 1);
  o.d_v = std::clamp(o.d_v, 1, o.d_qk);
  o.topk = std::max<std::int64_t>(o.topk, 1);
  o.invalid_fraction = std::clamp(o.invalid_fraction, 0.0, 1.0);
  if (!(o.value_scale > 0.0 && std::isfinite(o.value_scale))) o.value_scale = 1.0;
  if (!(o.query_scale > 0.0 && std::isfinite(o.query_scale))) o.query_scale = 1.0;
  return o;
}

}  // namespace

Status check_prefill_case_options(const PrefillCaseOptions& o) {
  if (o.s_q < 1) return invalid_argument("s_q", ">= 1", fmt::format("{}", o.s_q));
  if (o.s_kv < 1) return invalid_argument("s_kv", ">= 1", fmt::format("{}", o.s_kv));
  if (o.num_heads < 1 || o.num_heads > kMaxHeads) {
    return invalid_argument("num_heads", "in [1, 128]", fmt::format("{}", o.num_heads));
  }
  if (o.d_qk < 1) return invalid_argument("d_qk", ">= 1", fmt::format("{}", o.d_qk));
  if (o.d_v < 1 || o.d_v > o.d_qk)
    return invalid_argument("d_v", fmt::format("in [1, d_qk={}]", o.d_qk), fmt::format("{}", o.d_v));
  if (o.topk < 1) return invalid_argument("topk", ">= 1", fmt::format("{}", o.topk));
  if (!(o.invalid_fraction >= 0.0 && o.invalid_fraction <= 1.0)) {
    return invalid_argument("invalid_fraction", "in [0, 1]", fmt::format("{}", o.invalid_fraction));
  }
  if (!(o.value_scale > 0.0 && std::isfinite(o.value_scale))) {
    return invalid_argument("value_scale", "finite > 0", fmt::format("{}", o.value_scale));
  }
  if (!(o.query_scale > 0.0 && std::isfinite(o.query_scale))) {
    return invalid_argument("query_scale", "finite > 0", fmt::format("{}", o.query_scale));
  }
  return Status::Ok();
}

HostTensor PrefillCase::make_out() const {
  const TensorView& v = out_.view();
  return HostTensor::zeros(DType::kBF16, {v.shape[0], v.shape[1], v.shape[2]}, {v.stride[0], v.stride[1], v.stride[2]});
}
HostTensor PrefillCase::make_max_logits() const {
  const TensorView& v = max_logits_.view();
  return HostTensor::zeros(DType::kF32, {v.shape[0], v.shape[1]}, {v.stride[0], v.stride[1]});
}
HostTensor PrefillCase::make_lse() const {
  const TensorView& v = lse_.view();
  return HostTensor::zeros(DType::kF32, {v.shape[0], v.shape[1]}, {v.stride[0], v.stride[1]});
}

SparsePrefillArgs PrefillCase::args_with_outputs(const TensorView& out, const TensorView& max_logits,
                                                 const TensorView& lse) const {
  SparsePrefillArgs a;
  a.q = q_.view();
  a.kv = kv_.view();
  a.indices = indices_.view();
  a.topk_length = topk_length_.view();
  a.sink = sink_.view();
  a.softmax_scale = softmax_scale_;
  a.d_v = options_.d_v;
  a.out = out;
  a.max_logits = max_logits;
  a.lse = lse;
  return a;
}

void PrefillCase::poison_outputs() {
  poison(out_.view());
  poison(max_logits_.view());
  poison(lse_.view());
}

SparsePrefillArgs PrefillCase::args() {
  poison_outputs();
  return args_with_outputs(out_.view(), max_logits_.view(), lse_.view());
}

PrefillCase make_prefill_case(const PrefillCaseOptions& options) {
  const PrefillCaseOptions o = clamped(options);
  Rng rng(o.seed);
  PrefillCase c;
  c.options_ = o;
  c.softmax_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(o.d_qk)));
  const std::int64_t H = o.num_heads;
  const std::int64_t head_stride = o.strided ? o.d_qk + kRowPad : o.d_qk;

  c.q_ = HostTensor::zeros(DType::kBF16, {o.s_q, H, o.d_qk}, {H * head_stride, head_stride, 1});
  if (o.strided) std::memset(c.q_.bytes(), 0xFF, c.q_.size_bytes());
  detail::fill_bf16_normal(c.q_.view(), rng, o.value_scale * o.query_scale);

  c.kv_ = HostTensor::zeros(DType::kBF16, {o.s_kv, o.d_qk}, {o.strided ? o.d_qk + kRowPad : o.d_qk, 1});
  if (o.strided) std::memset(c.kv_.bytes(), 0xFF, c.kv_.size_bytes());
  detail::fill_bf16_normal(c.kv_.view(), rng, o.value_scale);

  c.indices_ = HostTensor::zeros(DType::kI32, {o.s_q, o.topk}, {o.strided ? o.topk + kIndexPad : o.topk, 1});
  if (o.topk_length) c.topk_length_ = HostTensor::zeros(DType::kI32, {o.s_q});
  std::vector<bool> attended(static_cast<std::size_t>(o.s_kv));
  for (std::int64_t s = 0; s < o.s_q; ++s) {
    std::vector<std::int64_t> rows = detail::distinct_sample(rng, o.s_kv, std::min(o.topk, o.s_kv));
    rows.resize(static_cast<std::size_t>(o.topk), -1);
    const std::int64_t length = o.topk_length ? detail::random_int(rng, 0, o.topk) : o.topk;
    if (o.topk_length) at<std::int32_t>(c.topk_length_.view(), s) = static_cast<std::int32_t>(length);
    for (std::int64_t k = 0; k < o.topk; ++k) {
      std::int64_t value = rows[static_cast<std::size_t>(k)];
      if (detail::random_bernoulli(rng, o.invalid_fraction)) value = detail::random_invalid_index(rng, o.s_kv);
      at<std::int32_t>(c.indices_.view(), s, k) = static_cast<std::int32_t>(value);
      if (k < length && value >= 0 && value < o.s_kv) attended[static_cast<std::size_t>(value)] = true;
    }
  }
  if (o.poison_unselected) {
    for (std::int64_t r = 0; r < o.s_kv; ++r) {
      if (attended[static_cast<std::size_t>(r)]) continue;
      for (std::int64_t d = 0; d < o.d_qk; ++d) at<std::uint16_t>(c.kv_.view(), r, d) = 0x7FC0;
    }
  }

  if (o.sink) {
    c.sink_ = HostTensor::zeros(DType::kF32, {H});
    detail::fill_sink(c.sink_.view(), rng);
  }
  const std::int64_t out_head_stride = o.strided ? o.d_v + kRowPad : o.d_v;
  c.out_ = HostTensor::zeros(DType::kBF16, {o.s_q, H, o.d_v}, {H * out_head_stride, out_head_stride, 1});
  c.max_logits_ = HostTensor::zeros(DType::kF32, {o.s_q, H}, {o.strided ? H + kStatPad : H, 1});
  c.lse_ = HostTensor::zeros(DType::kF32, {o.s_q, H}, {o.strided ? H + kStatPad : H, 1});
  c.poison_outputs();
  return c;
}

}  // namespace smla::testkit
