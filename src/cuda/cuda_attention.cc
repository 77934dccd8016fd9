// Public CUDA entry points (smla/cuda.h): validation, params from the tensor
// views, planning and launch. No allocation and no host synchronization here.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "smla/cuda.h"
#include "src/core/attention_validate.h"
#include "src/cuda/current_device.h"
#include "src/cuda/attention_plan.h"
#include "src/cuda/sparse_attention_params.h"

namespace smla {
namespace {

using cuda::AttentionPlan;
using cuda::KvSourceParams;
using cuda::LoaderKind;
using cuda::SparseAttentionParams;

bool aligned(const void* pointer, std::uintptr_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

std::int64_t stride_bytes(const TensorView& view, int dim) {
  return view.stride[static_cast<std::size_t>(dim)] * static_cast<std::int64_t>(dtype_size(view.dtype));
}

LoaderKind loader_for(KvFormat format) {
  switch (format) {
    case KvFormat::kV4Fp8: return LoaderKind::kV4Fp8;
    case KvFormat::kV32Fp8: return LoaderKind::kV32Fp8;
    case KvFormat::kBf16Rows: return LoaderKind::kBf16Rows512;
    case KvFormat::kFp8Rows: break;
  }
  return LoaderKind::kFp8Rows;
}

// The kernels copy rows with 16-byte cp.async: page bases and row strides must allow it.
Status check_row_alignment(std::string_view name, const void* base, std::int64_t page_stride, std::int64_t row_stride) {
  if (!aligned(base, 16) || page_stride % 16 != 0 || row_stride % 16 != 0) {
    return invalid_argument(name, "a 16-byte aligned base, page stride and row stride for the cuda backend",
                            fmt::format("base {}, page stride {} B, row stride {} B", base, page_stride, row_stride));
  }
  return Status::Ok();
}

Expected<KvSourceParams> source_params(std::string_view name, const KvCacheView& cache, const TensorView& indices,
                                       const TensorView& lengths) {
  KvSourceParams src;
  src.pages = static_cast<const std::uint8_t*>(cache.pages.data);
  src.page_stride_bytes = cache.page_stride_bytes();
  src.row_stride_bytes = stride_bytes(cache.pages, 1);
  src.page_size = cache.page_size();
  src.num_slots = cache.num_slots();
  src.fp8_scale = cache.fp8_scale;
  src.indices = static_cast<const std::int32_t*>(indices.data);
  src.stride_indices_t = indices.stride[0];
  src.topk = static_cast<int>(indices.shape[1]);
  if (lengths.present()) {
    src.lengths = static_cast<const std::int32_t*>(lengths.data);
    src.stride_lengths_t = lengths.stride[0];
  }
  if (src.num_slots > INT32_MAX) src.num_slots = INT32_MAX;  // int32 indices cannot address more
  // Packed FP8 formats place rows by the traits (all 16-byte multiples); plain rows use the tensor's row stride.
  const bool plain_rows = cache.format == KvFormat::kBf16Rows || cache.format == KvFormat::kFp8Rows;
  const std::int64_t page_stride = cache.num_pages() > 1 ? src.page_stride_bytes : 0;
  SMLA_RETURN_IF_ERROR(check_row_alignment(name, src.pages, page_stride, plain_rows ? src.row_stride_bytes : 0));
  return src;
}

void set_outputs(const TensorView& out, const TensorView& lse, SparseAttentionParams* p) {
  p->out = static_cast<std::uint16_t*>(out.data);
  p->stride_out_t = out.stride[0];
  p->stride_out_h = out.stride[1];
  p->out_aligned_4 = aligned(out.data, 4) && out.stride[0] % 2 == 0 && out.stride[1] % 2 == 0;
  if (lse.present()) {
    p->lse = static_cast<float*>(lse.data);
    p->stride_lse_t = lse.stride[0];
    p->stride_lse_h = lse.stride[1];
  }
}

void set_query(const TensorView& q, const TensorView& sink, float softmax_scale, SparseAttentionParams* p) {
  p->q = static_cast<const std::uint16_t*>(q.data);
  p->stride_q_t = q.stride[0];
  p->stride_q_h = q.stride[1];
  p->q_aligned_16 = aligned(q.data, 16) && q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0;
  p->num_tokens = static_cast<int>(q.shape[0]);
  p->num_heads = static_cast<int>(q.shape[1]);
  if (sink.present()) {
    p->sink = static_cast<const float*>(sink.data);
    p->stride_sink = sink.stride[0];
  }
  // softmax_scale is finite and > 0 (validated); above ~2.4e38 its log2(e) multiple
  // would overflow, and FLT_MAX differs from it only for raw score differences
  // below 1e-36 (docs/attention.md).
  p->scale_log2 = std::min(softmax_scale * cuda::kLog2e, std::numeric_limits<float>::max());
  p->softmax_scale = softmax_scale;
}

struct PreparedCall {
  SparseAttentionParams params;
  AttentionPlan plan;
};

Expected<PreparedCall> prepare_decode(const SparseDecodeArgs& args) {
  auto shape = detail::validate_sparse_decode(args, DeviceKind::kCuda);
  if (!shape) return shape.status().with_context("cuda_sparse_decode: ");
  if (shape->num_tokens > INT32_MAX) return invalid_argument("q", "at most 2^31-1 tokens", std::to_string(shape->num_tokens));
  SMLA_RETURN_IF_ERROR(cuda::check_on_current_device(args.q.device.index, "q"));
  PreparedCall call;
  SparseAttentionParams& p = call.params;
  set_query(args.q, args.sink, args.softmax_scale, &p);
  auto main_source = source_params("main_cache", args.main_cache, args.main_indices, args.main_lengths);
  if (!main_source) return main_source.status();
  p.source[0] = *main_source;
  if (args.extra_cache.has_value()) {
    auto extra_source = source_params("extra_cache", *args.extra_cache, args.extra_indices, args.extra_lengths);
    if (!extra_source) return extra_source.status();
    p.source[1] = *extra_source;
    p.num_sources = 2;
  }
  set_outputs(args.out, args.lse, &p);
  const std::int64_t keys = shape->main_topk + (args.extra_cache.has_value() ? shape->extra_topk : 0);
  auto plan = cuda::plan_attention(loader_for(args.main_cache.format), shape->num_tokens, shape->num_heads, keys,
                                   args.queries_per_request);
  if (!plan) return plan.status();
  call.plan = *plan;
  return call;
}

Expected<PreparedCall> prepare_prefill(const SparsePrefillArgs& args) {
  auto shape = detail::validate_sparse_prefill(args, DeviceKind::kCuda);
  if (!shape) return shape.status().with_context("cuda_sparse_prefill: ");
  if (shape->d_v != cuda::kValueDim) {
    return unimplemented(fmt::format("cuda_sparse_prefill: d_v {} (the cuda backend supports d_v = 512)", shape->d_v));
  }
  if (shape->d_qk != 512 && shape->d_qk != 576) {
    return unimplemented(fmt::format("cuda_sparse_prefill: d_qk {} (the cuda backend supports 512 and 576)", shape->d_qk));
  }
  if (shape->num_queries > INT32_MAX) return invalid_argument("q", "at most 2^31-1 queries", std::to_string(shape->num_queries));
  SMLA_RETURN_IF_ERROR(cuda::check_on_current_device(args.q.device.index, "q"));
  PreparedCall call;
  SparseAttentionParams& p = call.params;
  set_query(args.q, args.sink, args.softmax_scale, &p);
  // The flat workspace is one page of s_kv rows.
  KvSourceParams& src = p.source[0];
  src.pages = static_cast<const std::uint8_t*>(args.kv.data);
  src.page_stride_bytes = 0;
  src.row_stride_bytes = stride_bytes(args.kv, 0);
  src.page_size = shape->num_kv > 0 ? shape->num_kv : 1;
  src.num_slots = shape->num_kv > INT32_MAX ? INT32_MAX : shape->num_kv;
  src.indices = static_cast<const std::int32_t*>(args.indices.data);
  src.stride_indices_t = args.indices.stride[0];
  src.topk = static_cast<int>(shape->topk);
  if (args.topk_length.present()) {
    src.lengths = static_cast<const std::int32_t*>(args.topk_length.data);
    src.stride_lengths_t = args.topk_length.stride[0];
  }
  SMLA_RETURN_IF_ERROR(check_row_alignment("kv", src.pages, 0, src.row_stride_bytes));
  set_outputs(args.out, args.lse, &p);
  if (args.max_logits.present()) {
    p.max_logits = static_cast<float*>(args.max_logits.data);
    p.stride_max_t = args.max_logits.stride[0];
    p.stride_max_h = args.max_logits.stride[1];
  }
  const LoaderKind kind = shape->d_qk == 512 ? LoaderKind::kBf16Rows512 : LoaderKind::kBf16Rows576;
  auto plan = cuda::plan_attention(kind, shape->num_queries, shape->num_heads, shape->topk);
  if (!plan) return plan.status();
  call.plan = *plan;
  return call;
}

Status run_prepared(PreparedCall& call, void* workspace, std::size_t workspace_bytes, void* stream) {
  if (workspace_bytes < call.plan.workspace_bytes) {
    return invalid_argument("workspace_bytes", fmt::format(">= {} (the *_workspace_size query)", call.plan.workspace_bytes),
                            std::to_string(workspace_bytes));
  }
  if (call.plan.workspace_bytes > 0 && (workspace == nullptr || !aligned(workspace, 256))) {
    return invalid_argument("workspace", "a 256-byte aligned device pointer", fmt::format("{}", workspace));
  }
  cuda::assign_workspace(call.plan, workspace, &call.params);
  return cuda::launch_planned_attention(call.plan, call.params, static_cast<cudaStream_t>(stream));
}

}  // namespace

Expected<std::size_t> cuda_sparse_decode_workspace_size(const SparseDecodeArgs& args) {
  auto call = prepare_decode(args);
  if (!call) return call.status();
  return call->plan.workspace_bytes;
}

Status cuda_sparse_decode(const SparseDecodeArgs& args, void* workspace, std::size_t workspace_bytes, void* stream) {
  auto call = prepare_decode(args);
  if (!call) return call.status();
  return run_prepared(*call, workspace, workspace_bytes, stream);
}

Expected<std::size_t> cuda_sparse_prefill_workspace_size(const SparsePrefillArgs& args) {
  auto call = prepare_prefill(args);
  if (!call) return call.status();
  return call->plan.workspace_bytes;
}

Status cuda_sparse_prefill(const SparsePrefillArgs& args, void* workspace, std::size_t workspace_bytes, void* stream) {
  auto call = prepare_prefill(args);
  if (!call) return call.status();
  return run_prepared(*call, workspace, workspace_bytes, stream);
}

}  // namespace smla
