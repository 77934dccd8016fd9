// The CUDA attention implementations ("cuda.sm90", "cuda.portable"): their
// registry rows, plans from shapes, kernel params from the validated views and
// the launch. No allocation and no host synchronization here.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "smla/attention.h"
#include "src/core/attention_validate.h"
#include "src/cuda/attention_plan.h"
#include "src/cuda/common/current_device.h"
#include "src/cuda/common/sparse_attention_params.h"
#include "src/runtime/op_tables.h"
#include "src/runtime/registry_internal.h"

namespace smla::runtime {
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
  const bool plain_rows = kv_format_info(cache.format).layout == KvRowLayout::kPlainRows;
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

LoaderKind loader_for(const Problem& problem) {
  if (problem.op == Op::kSparseDecode) return cuda::loader_kind(*problem.format);
  return cuda::flat_bf16_loader_kind(problem.d_qk);
}

// Tensors on the context's device, which is the calling thread's current one.
Status check_device(const Context& context, const TensorView& q) {
  auto current = cuda::current_device();
  if (!current) return current.status();
  if (*current != context.device().ordinal) {
    return invalid_argument("context", fmt::format("the current device cuda:{}", *current),
                            fmt::format("a context of cuda:{}", context.device().ordinal));
  }
  return cuda::check_on_device(q.device.index, *current, "q");
}

Expected<SparseAttentionParams> decode_params(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  if (shape.num_tokens > INT32_MAX) return invalid_argument("q", "at most 2^31-1 tokens", std::to_string(shape.num_tokens));
  SparseAttentionParams p;
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
  return p;
}

Expected<SparseAttentionParams> prefill_params(const SparsePrefillArgs& args, const detail::PrefillShape& shape) {
  if (shape.num_queries > INT32_MAX) return invalid_argument("q", "at most 2^31-1 queries", std::to_string(shape.num_queries));
  SparseAttentionParams p;
  set_query(args.q, args.sink, args.softmax_scale, &p);
  // The flat workspace is one page of s_kv rows.
  KvSourceParams& src = p.source[0];
  src.pages = static_cast<const std::uint8_t*>(args.kv.data);
  src.page_stride_bytes = 0;
  src.row_stride_bytes = stride_bytes(args.kv, 0);
  src.page_size = shape.num_kv > 0 ? shape.num_kv : 1;
  src.num_slots = shape.num_kv > INT32_MAX ? INT32_MAX : shape.num_kv;
  src.indices = static_cast<const std::int32_t*>(args.indices.data);
  src.stride_indices_t = args.indices.stride[0];
  src.topk = static_cast<int>(shape.topk);
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
  return p;
}

cuda::AttentionShape attention_shape(const Problem& problem) {
  return {loader_for(problem), problem.tokens, problem.heads, problem.keys, problem.queries_per_request};
}

std::string plan_description(const PlanState& state) {
  const auto& plan = *static_cast<const AttentionPlan*>(state.data.get());
  std::string text = fmt::format("{}-row tiles x {} head blocks, {} splits, {} stages, {} K buffers, {} B shared memory",
                                 plan.variant.rows, plan.head_blocks, plan.num_splits, plan.kv_stages, plan.k_buffers,
                                 plan.smem_bytes);
  if (plan.pack_tokens > 1) text += fmt::format(", {} tokens packed per CTA", plan.pack_tokens);
  if (plan.prefetch_rows) text += ", L2 prefetch";
  return text + fmt::format(", {} B scratch", plan.workspace_bytes);
}

template <cuda::KernelFamily kFamily>
Expected<PlanState> plan_family(const Context& context, const Problem& problem) {
  auto plan = cuda::plan_attention(kFamily, attention_shape(problem), context.device(), context.tuning());
  if (!plan) return plan.status();
  PlanState state;
  state.workspace_bytes = plan->workspace_bytes;
  state.describe = &plan_description;
  state.data = std::make_shared<const AttentionPlan>(*plan);
  return state;
}

Status launch(const Context& context, const PlanState& state, SparseAttentionParams params, void* scratch) {
  const auto& plan = *static_cast<const AttentionPlan*>(state.data.get());
  cuda::assign_workspace(plan, scratch, &params);
  return cuda::launch_planned_attention(plan, params, static_cast<cudaStream_t>(context.stream()));
}

Status run_decode(const Context& context, const PlanState& state, const SparseDecodeArgs& args,
                  const detail::DecodeShape& shape, void* scratch) {
  SMLA_RETURN_IF_ERROR(check_device(context, args.q));
  auto params = decode_params(args, shape);
  if (!params) return params.status();
  return launch(context, state, *params, scratch);
}

Status run_prefill(const Context& context, const PlanState& state, const SparsePrefillArgs& args,
                   const detail::PrefillShape& shape, void* scratch) {
  SMLA_RETURN_IF_ERROR(check_device(context, args.q));
  auto params = prefill_params(args, shape);
  if (!params) return params.status();
  return launch(context, state, *params, scratch);
}

bool prefers_sm90_tiles(const Context& context, const Problem& problem) {
  return cuda::sm90_tiles_preferred(attention_shape(problem), context.device(), context.tuning());
}

using DecodeFunctions = PlannedFunctions<SparseDecodeArgs, detail::DecodeShape>;
using PrefillFunctions = PlannedFunctions<SparsePrefillArgs, detail::PrefillShape>;
constexpr DecodeFunctions kPortableDecode{&plan_family<cuda::KernelFamily::kPortable>, &run_decode};
constexpr PrefillFunctions kPortablePrefill{&plan_family<cuda::KernelFamily::kPortable>, &run_prefill};
constexpr DecodeFunctions kSm90Decode{&plan_family<cuda::KernelFamily::kSm90>, &run_decode};
constexpr PrefillFunctions kSm90Prefill{&plan_family<cuda::KernelFamily::kSm90>, &run_prefill};

// Both kernels read every format; prefill's flat workspace holds bf16 rows of d_qk 512 or 576.
// queries_per_request is a hint either serves: only the portable kernel packs tokens.
Capabilities cuda_capabilities(int min_sm, int max_sm) {
  Capabilities caps;
  caps.d_qk = {512, 576};
  caps.d_v = {static_cast<int>(cuda::kValueDim)};
  caps.min_compute_capability = min_sm;
  caps.max_compute_capability = max_sm;
  return caps;
}

}  // namespace

void add_cuda_attention_entries(std::vector<Entry>& rows) {
  constexpr std::string_view kPortable = "sm80+ kernel: mma.sync, cp.async rows, split-KV, packed MTP tiles";
  constexpr std::string_view kSm90 = "sm_90a kernel: wgmma, warp-specialised, 64-row tiles, CTA pairs";
  rows.push_back({{Op::kSparseDecode, "cuda.portable", Backend::kCuda, 0, cuda_capabilities(80, 0), kPortable},
                  nullptr, &kPortableDecode});
  rows.push_back({{Op::kSparsePrefill, "cuda.portable", Backend::kCuda, 0, cuda_capabilities(80, 0), kPortable},
                  nullptr, &kPortablePrefill});
  if (!cuda::sm90_kernels_built()) return;
  rows.push_back({{Op::kSparseDecode, "cuda.sm90", Backend::kCuda, 10, cuda_capabilities(90, 90), kSm90},
                  &prefers_sm90_tiles, &kSm90Decode});
  rows.push_back({{Op::kSparsePrefill, "cuda.sm90", Backend::kCuda, 10, cuda_capabilities(90, 90), kSm90},
                  &prefers_sm90_tiles, &kSm90Prefill});
}

}  // namespace smla::runtime
