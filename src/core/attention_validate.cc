// Argument checks shared by every attention backend. Each failure names the
// argument, the expected and the actual value; nothing here reads index values
// (out-of-range indices are "not attended", never an error).
#include "src/core/attention_validate.h"

#include <fmt/format.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>

namespace smla::detail {

namespace {

constexpr std::int64_t kMaxHeads = 128;

// One expected dimension: its size (or -1 for "any non-negative") and the symbol it is printed with.
struct Dim {
  std::int64_t size;
  std::string_view symbol;
};

std::string expected_shape(std::initializer_list<Dim> dims) {
  std::string s = "[";
  bool first = true;
  for (const Dim& d : dims) {
    if (!first) s += ", ";
    first = false;
    s += d.size >= 0 ? fmt::format("{}={}", d.symbol, d.size) : std::string(d.symbol);
  }
  return s + "]";
}

// Checks presence, dtype, rank, shape, last-dim contiguity, data pointer and device.
Status check_tensor(const TensorView& t, std::string_view name, DType dtype, std::initializer_list<Dim> dims,
                    DeviceKind device) {
  if (!t.present()) return invalid_argument(name, "a tensor", "an absent tensor");
  if (t.dtype != dtype) {
    return invalid_argument(name, fmt::format("dtype {}", dtype_name(dtype)), dtype_name(t.dtype));
  }
  const int rank = static_cast<int>(dims.size());
  if (t.rank != rank) {
    return invalid_argument(name, fmt::format("rank {} {}", rank, expected_shape(dims)),
                            fmt::format("rank {} {}", t.rank, t.shape_string()));
  }
  int d = 0;
  for (const Dim& dim : dims) {
    const std::int64_t actual = t.shape[static_cast<std::size_t>(d++)];
    if ((dim.size >= 0 && actual != dim.size) || actual < 0) {
      return invalid_argument(name, fmt::format("shape {}", expected_shape(dims)), t.shape_string());
    }
  }
  const std::size_t last = static_cast<std::size_t>(rank - 1);
  if (t.stride[last] != 1 && t.shape[last] > 1) {
    return invalid_argument(name, "a contiguous last dimension (stride 1)", t.describe());
  }
  if (t.numel() > 0 && t.data == nullptr) return invalid_argument(name, "non-null data", "nullptr");
  if (t.device.kind != device) {
    return invalid_argument(name, fmt::format("a {} tensor", device_kind_name(device)),
                            device_kind_name(t.device.kind));
  }
  return Status::Ok();
}

Status check_optional(const TensorView& t, std::string_view name, DType dtype, std::initializer_list<Dim> dims,
                      DeviceKind device) {
  return t.present() ? check_tensor(t, name, dtype, dims, device) : Status::Ok();
}

Status check_cache(const KvCacheView& cache, std::string_view name, DeviceKind device) {
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, name));
  if (cache.pages.device.kind != device) {
    return invalid_argument(name, fmt::format("a {} tensor", device_kind_name(device)),
                            device_kind_name(cache.pages.device.kind));
  }
  return Status::Ok();
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

  if (!args.q.present()) return invalid_argument("q", "a tensor", "an absent tensor");
  if (args.q.rank == 3) {
    shape.num_tokens = args.q.shape[0];
    shape.num_heads = args.q.shape[1];
  }
  const std::int64_t T = shape.num_tokens;
  SMLA_RETURN_IF_ERROR(check_tensor(args.q, "q", DType::kBF16, {{-1, "T"}, {-1, "h_q"}, {shape.d_qk, "d_qk"}}, dev));
  SMLA_RETURN_IF_ERROR(check_num_heads(shape.num_heads));
  const std::int64_t H = shape.num_heads;

  const TensorView& mi = args.main_indices;
  if (mi.present() && mi.rank == 2) shape.main_topk = mi.shape[1];
  SMLA_RETURN_IF_ERROR(check_tensor(mi, "main_indices", DType::kI32, {{T, "T"}, {-1, "k_main"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional(args.main_lengths, "main_lengths", DType::kI32, {{T, "T"}}, dev));
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
    SMLA_RETURN_IF_ERROR(check_tensor(ei, "extra_indices", DType::kI32, {{T, "T"}, {-1, "k_extra"}}, dev));
    SMLA_RETURN_IF_ERROR(check_optional(args.extra_lengths, "extra_lengths", DType::kI32, {{T, "T"}}, dev));
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

  SMLA_RETURN_IF_ERROR(check_optional(args.sink, "sink", DType::kF32, {{H, "h_q"}}, dev));
  shape.has_sink = args.sink.present();
  SMLA_RETURN_IF_ERROR(check_softmax_scale(args.softmax_scale));
  SMLA_RETURN_IF_ERROR(check_tensor(args.out, "out", DType::kBF16, {{T, "T"}, {H, "h_q"}, {shape.d_v, "d_v"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional(args.lse, "lse", DType::kF32, {{T, "T"}, {H, "h_q"}}, dev));
  shape.has_lse = args.lse.present();

  SMLA_RETURN_IF_ERROR(check_queries_per_request(args.queries_per_request, T));

  SMLA_RETURN_IF_ERROR(check_length_values(args.main_lengths, "main_lengths", shape.main_topk));
  SMLA_RETURN_IF_ERROR(check_length_values(args.extra_lengths, "extra_lengths", shape.extra_topk));
  return shape;
}

Expected<PrefillShape> validate_sparse_prefill(const SparsePrefillArgs& args, DeviceKind expected_device) {
  const DeviceKind dev = expected_device;
  PrefillShape shape;
  if (!args.q.present()) return invalid_argument("q", "a tensor", "an absent tensor");
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
  SMLA_RETURN_IF_ERROR(check_tensor(args.q, "q", DType::kBF16, {{-1, "s_q"}, {-1, "h_q"}, {-1, "d_qk"}}, dev));
  SMLA_RETURN_IF_ERROR(check_num_heads(shape.num_heads));
  if (!known_dims) {
    return invalid_argument("q/d_v", fmt::format("head dims {}", supported),
                            fmt::format("d_qk={}, d_v={}", shape.d_qk, args.d_v));
  }
  shape.d_v = args.d_v;
  const std::int64_t H = shape.num_heads;
  if (args.kv.present() && args.kv.rank == 2) shape.num_kv = args.kv.shape[0];
  SMLA_RETURN_IF_ERROR(check_tensor(args.kv, "kv", DType::kBF16, {{-1, "s_kv"}, {shape.d_qk, "d_qk"}}, dev));
  if (args.indices.present() && args.indices.rank == 2) shape.topk = args.indices.shape[1];
  SMLA_RETURN_IF_ERROR(check_tensor(args.indices, "indices", DType::kI32, {{S, "s_q"}, {-1, "topk"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional(args.topk_length, "topk_length", DType::kI32, {{S, "s_q"}}, dev));
  shape.has_topk_length = args.topk_length.present();
  SMLA_RETURN_IF_ERROR(check_optional(args.sink, "sink", DType::kF32, {{H, "h_q"}}, dev));
  shape.has_sink = args.sink.present();
  SMLA_RETURN_IF_ERROR(check_softmax_scale(args.softmax_scale));
  SMLA_RETURN_IF_ERROR(check_tensor(args.out, "out", DType::kBF16, {{S, "s_q"}, {H, "h_q"}, {shape.d_v, "d_v"}}, dev));
  SMLA_RETURN_IF_ERROR(check_optional(args.max_logits, "max_logits", DType::kF32, {{S, "s_q"}, {H, "h_q"}}, dev));
  shape.has_max_logits = args.max_logits.present();
  SMLA_RETURN_IF_ERROR(check_optional(args.lse, "lse", DType::kF32, {{S, "s_q"}, {H, "h_q"}}, dev));
  shape.has_lse = args.lse.present();
  SMLA_RETURN_IF_ERROR(check_length_values(args.topk_length, "topk_length", shape.topk));
  return shape;
}

}  // namespace smla::detail
