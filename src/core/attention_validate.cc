// Argument checks shared by every attention backend: the shared tensor checks
// (src/core/argument_checks.h) plus what only attention knows (format and head
// dims, lengths against index widths, queries per request). Each failure names
// the argument, the expected and the actual value; nothing here reads index
// values (out-of-range indices are "not attended", never an error).
#include "src/core/attention_validate.h"

#include <fmt/format.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>

#include "src/core/argument_checks.h"

namespace smla::detail {

namespace {

constexpr std::int64_t kMaxHeads = 128;

// The kernels take signed strides; only rows must be contiguous.
constexpr StrideRule kOperandStrides{.last_dim_contiguous = true, .non_negative = false};

Status check_operand(const TensorView& t, std::string_view name, DType dtype, std::initializer_list<Extent> extents,
                     DeviceKind device) {
  return check_tensor(t, name, {dtype}, extents, device, kOperandStrides);
}

Status check_optional_operand(const TensorView& t, std::string_view name, DType dtype,
                              std::initializer_list<Extent> extents, DeviceKind device) {
  return check_optional_tensor(t, name, {dtype}, extents, device, kOperandStrides);
}

Status check_cache(const KvCacheView& cache, std::string_view name, DeviceKind device) {
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, name));
  return check_device(cache.pages, name, device);
}

// Length values, readable only when they live in host memory.
Status check_length_values(const TensorView& lengths, std::string_view name, std::int64_t width) {
  if (!lengths.present() || lengths.device.kind != DeviceKind::kCpu) return Status::Ok();
  for (std::int64_t t = 0; t < lengths.shape[0]; ++t) {
    const std::int32_t len = lengths.ptr<const std::int32_t>()[t * lengths.stride[0]];
    if (len < 0 || len > width) {
      return out_of_range(fmt::format("{}[{}]", name, t), fmt::format("a length in [0, {}]", width),
                          fmt::format("{}", len));
    }
  }
  return Status::Ok();
}

Status check_softmax_scale(float scale) {
  if (!(std::isfinite(scale) && scale > 0.0f)) {
    return invalid_argument("softmax_scale", "a finite value > 0", fmt::format("{}", scale));
  }
  return Status::Ok();
}

Status check_num_heads(std::int64_t h_q) {
  if (h_q < 1 || h_q > kMaxHeads) {
    return invalid_argument("q", fmt::format("h_q (dim 1) in [1, {}]", kMaxHeads), fmt::format("{}", h_q));
  }
  return Status::Ok();
}

Status check_queries_per_request(std::int64_t queries_per_request, std::int64_t num_tokens) {
  if (queries_per_request < 1) {
    return invalid_argument("queries_per_request", ">= 1", fmt::format("{}", queries_per_request));
  }
  if (num_tokens % queries_per_request != 0) {
    return invalid_argument("queries_per_request", fmt::format("a divisor of T = {}", num_tokens),
                            fmt::format("{}", queries_per_request));
  }
  return Status::Ok();
}

}  // namespace

Expected<DecodeShape> validate_sparse_decode(const SparseDecodeArgs& args, DeviceKind expected_device) {
  const DeviceKind dev = expected_device;
  DecodeShape shape;
  SMLA_RETURN_IF_ERROR(check_cache(args.main_cache, "main_cache", dev));
  const KvFormatInfo info = kv_format_info(args.main_cache.format);
  shape.d_qk = info.head_dim;
  shape.d_v = info.value_dim;

  if (args.q.rank == 3) {
    shape.num_tokens = args.q.shape[0];
    shape.num_heads = args.q.shape[1];
  }
  const std::int64_t T = shape.num_tokens;
  SMLA_RETURN_IF_ERROR(
      check_operand(args.q, "q", DType::kBF16, {{kAnyExtent, "T"}, {kAnyExtent, "h_q"}, {shape.d_qk, "d_qk"}}, dev));
  SMLA_RETURN_IF_ERROR(check_num_heads(shape.num_heads));
  const std::int64_t H = shape.num_heads;

  const TensorView& mi = args.main_indices;
  if (mi.present() && mi.rank == 2) shape.main_topk = mi.shape[1];
  SMLA_RETURN_IF_ERROR(check_operand(mi, "main_indices", DType::kI32, {{T, "T"}, {kAnyExtent, "k_main"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional_operand(args.main_lengths, "main_lengths", DType::kI32, {{T, "T"}}, dev));
  shape.has_main_lengths = args.main_lengths.present();

  if (args.extra_cache.has_value()) {
    if (args.extra_cache->format != args.main_cache.format) {
      return invalid_argument("extra_cache", fmt::format("format {} (the main cache's)", info.name),
                              kv_format_name(args.extra_cache->format));
    }
    SMLA_RETURN_IF_ERROR(check_cache(*args.extra_cache, "extra_cache", dev));
    const TensorView& ei = args.extra_indices;
    if (!ei.present())
      return invalid_argument("extra_indices", "a tensor (required with extra_cache)", "an absent tensor");
    if (ei.present() && ei.rank == 2) shape.extra_topk = ei.shape[1];
    SMLA_RETURN_IF_ERROR(check_operand(ei, "extra_indices", DType::kI32, {{T, "T"}, {kAnyExtent, "k_extra"}}, dev));
    SMLA_RETURN_IF_ERROR(check_optional_operand(args.extra_lengths, "extra_lengths", DType::kI32, {{T, "T"}}, dev));
    shape.has_extra = true;
    shape.has_extra_lengths = args.extra_lengths.present();
  } else {
    if (args.extra_indices.present()) {
      return invalid_argument("extra_indices", "absent (there is no extra_cache)", args.extra_indices.describe());
    }
    if (args.extra_lengths.present()) {
      return invalid_argument("extra_lengths", "absent (there is no extra_cache)", args.extra_lengths.describe());
    }
  }

  SMLA_RETURN_IF_ERROR(check_optional_operand(args.sink, "sink", DType::kF32, {{H, "h_q"}}, dev));
  shape.has_sink = args.sink.present();
  SMLA_RETURN_IF_ERROR(check_softmax_scale(args.softmax_scale));
  SMLA_RETURN_IF_ERROR(check_operand(args.out, "out", DType::kBF16, {{T, "T"}, {H, "h_q"}, {shape.d_v, "d_v"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional_operand(args.lse, "lse", DType::kF32, {{T, "T"}, {H, "h_q"}}, dev));
  shape.has_lse = args.lse.present();

  SMLA_RETURN_IF_ERROR(check_queries_per_request(args.queries_per_request, T));
  SMLA_RETURN_IF_ERROR(check_optional_operand(args.token_order, "token_order", DType::kI32, {{T, "T"}}, dev));
  if (args.token_order_ready && !args.token_order.present()) {
    return invalid_argument("token_order", "a [T] i32 tensor (token_order_ready is true)", "an absent tensor");
  }

  SMLA_RETURN_IF_ERROR(check_length_values(args.main_lengths, "main_lengths", shape.main_topk));
  SMLA_RETURN_IF_ERROR(check_length_values(args.extra_lengths, "extra_lengths", shape.extra_topk));
  return shape;
}

Expected<PrefillShape> validate_sparse_prefill(const SparsePrefillArgs& args, DeviceKind expected_device) {
  const DeviceKind dev = expected_device;
  PrefillShape shape;
  if (args.q.rank == 3) {
    shape.num_queries = args.q.shape[0];
    shape.num_heads = args.q.shape[1];
    shape.d_qk = static_cast<int>(args.q.shape[2]);
  }
  // The head dims of the KV formats are the only supported ones (512 for V4, 576 for V3.2).
  bool known_dims = false;
  std::string supported;
  for (KvFormat f : {KvFormat::kV4Fp8, KvFormat::kV32Fp8}) {
    const KvFormatInfo info = kv_format_info(f);
    known_dims = known_dims || (info.head_dim == shape.d_qk && info.value_dim == args.d_v);
    supported += fmt::format("{}(d_qk={}, d_v={})", supported.empty() ? "" : " or ", info.head_dim, info.value_dim);
  }
  const std::int64_t S = shape.num_queries;
  SMLA_RETURN_IF_ERROR(
      check_operand(args.q, "q", DType::kBF16, {{kAnyExtent, "s_q"}, {kAnyExtent, "h_q"}, {kAnyExtent, "d_qk"}}, dev));
  SMLA_RETURN_IF_ERROR(check_num_heads(shape.num_heads));
  if (!known_dims) {
    return invalid_argument("q/d_v", fmt::format("head dims {}", supported),
                            fmt::format("d_qk={}, d_v={}", shape.d_qk, args.d_v));
  }
  shape.d_v = args.d_v;
  const std::int64_t H = shape.num_heads;
  if (args.kv.present() && args.kv.rank == 2) shape.num_kv = args.kv.shape[0];
  SMLA_RETURN_IF_ERROR(check_operand(args.kv, "kv", DType::kBF16, {{kAnyExtent, "s_kv"}, {shape.d_qk, "d_qk"}}, dev));
  if (args.indices.present() && args.indices.rank == 2) shape.topk = args.indices.shape[1];
  SMLA_RETURN_IF_ERROR(check_operand(args.indices, "indices", DType::kI32, {{S, "s_q"}, {kAnyExtent, "topk"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional_operand(args.topk_length, "topk_length", DType::kI32, {{S, "s_q"}}, dev));
  shape.has_topk_length = args.topk_length.present();
  SMLA_RETURN_IF_ERROR(check_optional_operand(args.sink, "sink", DType::kF32, {{H, "h_q"}}, dev));
  shape.has_sink = args.sink.present();
  SMLA_RETURN_IF_ERROR(check_softmax_scale(args.softmax_scale));
  SMLA_RETURN_IF_ERROR(check_operand(args.out, "out", DType::kBF16, {{S, "s_q"}, {H, "h_q"}, {shape.d_v, "d_v"}}, dev));
  SMLA_RETURN_IF_ERROR(
      check_optional_operand(args.max_logits, "max_logits", DType::kF32, {{S, "s_q"}, {H, "h_q"}}, dev));
  shape.has_max_logits = args.max_logits.present();
  SMLA_RETURN_IF_ERROR(check_optional_operand(args.lse, "lse", DType::kF32, {{S, "s_q"}, {H, "h_q"}}, dev));
  shape.has_lse = args.lse.present();
  SMLA_RETURN_IF_ERROR(check_length_values(args.topk_length, "topk_length", shape.topk));
  return shape;
}

}  // namespace smla::detail
