// The CUDA attention implementations ("cuda.sm90", "cuda.portable"): their
// registry rows, plans from shapes, kernel params from the validated views and
// the launch. No allocation and no host synchronization here.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "smla/attention.h"
#include "src/core/attention_operands.h"
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

// The kernels copy rows with 16-byte cp.async: page bases and row strides must allow it.
Status check_row_alignment(std::string_view name, const void* base, std::int64_t page_stride, std::int64_t row_stride) {
  if (!aligned(base, 16) || page_stride % 16 != 0 || row_stride % 16 != 0) {
    return invalid_argument(name, "a 16-byte aligned base, page stride and row stride for the cuda backend",
                            fmt::format("base {}, page stride {} B, row stride {} B", base, page_stride, row_stride));
  }
  return Status::Ok();
}

// Plain-row formats and the flat workspace address rows by the tensor's row stride; packed FP8
// formats place them by the traits (all 16-byte multiples), whatever that stride is.
bool rows_at_tensor_stride(const detail::AttentionOperands& operands) {
  return operands.source == detail::RowSource::kFlatBf16 ||
         kv_format_info(operands.format).layout == KvRowLayout::kPlainRows;
}

Expected<KvSourceParams> source_params(const detail::AttentionOperands& operands, const detail::KeySetOperands& set) {
  const std::int64_t page_stride = set.num_pages > 1 ? set.page_stride_bytes : 0;
  const std::int64_t row_stride = rows_at_tensor_stride(operands) ? set.row_stride_bytes : 0;
  SMLA_RETURN_IF_ERROR(check_row_alignment(set.argument_name, set.pages, page_stride, row_stride));
  KvSourceParams src;
  src.pages = set.pages;
  src.page_stride_bytes = set.page_stride_bytes;
  src.row_stride_bytes = set.row_stride_bytes;
  src.page_size = set.page_size;
  src.num_slots = std::min<std::int64_t>(set.num_slots, INT32_MAX);  // int32 indices cannot address more
  src.fp8_scale = set.fp8_scale;
  src.indices = set.indices;
  src.stride_indices_t = set.stride_indices_t;
  src.topk = static_cast<int>(set.width);
  src.lengths = set.lengths;
  src.stride_lengths_t = set.stride_lengths_t;
  return src;
}

// `token_noun` names T in the error ("tokens" for decode, "queries" for prefill).
Expected<SparseAttentionParams> kernel_params(const detail::AttentionOperands& operands, std::string_view token_noun) {
  if (operands.num_tokens > INT32_MAX) {
    return invalid_argument("q", fmt::format("at most 2^31-1 {}", token_noun), std::to_string(operands.num_tokens));
  }
  SparseAttentionParams p;
  p.q = operands.q;
  p.stride_q_t = operands.stride_q_t;
  p.stride_q_h = operands.stride_q_h;
  p.q_aligned_16 = aligned(p.q, 16) && p.stride_q_t % 8 == 0 && p.stride_q_h % 8 == 0;
  p.num_tokens = static_cast<int>(operands.num_tokens);
  p.num_heads = static_cast<int>(operands.num_heads);
  p.sink = operands.sink;
  p.stride_sink = operands.stride_sink;
  // softmax_scale is finite and > 0 (validated); above ~2.4e38 its log2(e) multiple
  // would overflow, and FLT_MAX differs from it only for raw score differences
  // below 1e-36 (docs/attention.md).
  p.scale_log2 = std::min(operands.softmax_scale * cuda::kLog2e, std::numeric_limits<float>::max());
  p.softmax_scale = operands.softmax_scale;
  for (int s = 0; s < operands.num_sets; ++s) {
    auto source = source_params(operands, operands.sets[s]);
    if (!source) return source.status();
    p.source[s] = *source;
  }
  p.num_sources = operands.num_sets;
  p.out = operands.out;
  p.stride_out_t = operands.stride_out_t;
  p.stride_out_h = operands.stride_out_h;
  p.out_aligned_4 = aligned(p.out, 4) && p.stride_out_t % 2 == 0 && p.stride_out_h % 2 == 0;
  p.out_aligned_16 = aligned(p.out, 16) && p.stride_out_t % 8 == 0 && p.stride_out_h % 8 == 0;
  p.lse = operands.lse;
  p.stride_lse_t = operands.stride_lse_t;
  p.stride_lse_h = operands.stride_lse_h;
  p.max_logits = operands.max_logits;
  p.stride_max_t = operands.stride_max_t;
  p.stride_max_h = operands.stride_max_h;
  return p;
}

LoaderKind loader_for(const Problem& problem) {
  if (problem.op == Op::kSparseDecode) return cuda::loader_kind(*problem.format);
  return cuda::flat_bf16_loader_kind(problem.d_qk);
}

// Every tensor on the context's device, which is the calling thread's current one.
Status check_devices(const Context& context, const SparseDecodeArgs& args) {
  const TensorView no_tensor;
  const TensorView& extra_pages = args.extra_cache.has_value() ? args.extra_cache->pages : no_tensor;
  return cuda::check_on_context_device(
      context, {{&args.q, "q"}, {&args.main_cache.pages, "main_cache"}, {&args.main_indices, "main_indices"},
                {&args.main_lengths, "main_lengths"}, {&extra_pages, "extra_cache"},
                {&args.extra_indices, "extra_indices"}, {&args.extra_lengths, "extra_lengths"}, {&args.sink, "sink"},
                {&args.out, "out"}, {&args.lse, "lse"}, {&args.token_order, "token_order"}});
}

Status check_devices(const Context& context, const SparsePrefillArgs& args) {
  return cuda::check_on_context_device(
      context, {{&args.q, "q"}, {&args.kv, "kv"}, {&args.indices, "indices"}, {&args.topk_length, "topk_length"},
                {&args.sink, "sink"}, {&args.out, "out"}, {&args.max_logits, "max_logits"}, {&args.lse, "lse"}});
}

cuda::AttentionShape attention_shape(const Problem& problem) {
  return {loader_for(problem), problem.tokens, problem.heads, problem.keys, problem.queries_per_request,
          problem.op == Op::kSparseDecode};
}

// What runs a staged call that may name more rows than the buffer holds (cuda::staging_route).
const char* overflow_note(const cuda::StagedRowsPlan& staged) {
  if (!staged.gated) return "";
  if (staged.stage_on_overflow) return ", the direct kernel behind";
  return "; the direct kernel alone if they may not fit, pool not staged";
}

std::string plan_description(const PlanState& state) {
  const auto& plan = *static_cast<const AttentionPlan*>(state.data.get());
  const std::string block_heads =
      plan.head_block_rows < plan.variant.rows ? fmt::format(" of {} heads", plan.head_block_rows) : "";
  std::string text = fmt::format("{}-row tiles x {} head blocks{}, {} splits, {} stages, {} K buffers, {} B shared memory",
                                 plan.variant.rows, plan.head_blocks, block_heads, plan.num_splits, plan.kv_stages,
                                 plan.k_buffers, plan.smem_bytes);
  if (plan.pack_tokens > 1) text += fmt::format(", {} tokens packed per CTA", plan.pack_tokens);
  if (cuda::runs_as_pairs(plan.flags, plan.head_blocks, plan.head_block_rows)) text += ", CTA pairs";
  if (plan.prefetch_rows) text += ", L2 prefetch";
  if (plan.flags.fold_splits) text += ", splits merged in their cluster";
  if (plan.order_tokens) text += ", tokens longest first when lengths are passed";
  if (plan.staged) {
    text += fmt::format(", FP8 rows staged as bf16 (up to {} rows{}) for {}-row tiles x {} head blocks, {} splits",
                        plan.staged->layout.capacity_rows, overflow_note(*plan.staged),
                        plan.staged->copying.variant.rows, plan.staged->copying.head_blocks,
                        plan.staged->copying.num_splits);
  }
  return text + fmt::format(", {} B scratch", plan.workspace_bytes);
}

template <cuda::KernelFamily kFamily>
Expected<PlanState> plan_family(const Context& context, const Problem& problem) {
  const auto occupancy = context.validates_only() ? cuda::Occupancy::kSharedMemoryOnly : cuda::Occupancy::kQueryDevice;
  auto plan = cuda::plan_attention(kFamily, attention_shape(problem), context.device(), context.tuning(), occupancy);
  if (!plan) return plan.status();
  PlanState state;
  state.workspace_bytes = plan->workspace_bytes;
  state.describe = &plan_description;
  state.data = std::make_shared<const AttentionPlan>(*plan);
  return state;
}

Status launch(const Context& context, const PlanState& state, SparseAttentionParams params, void* scratch,
              cuda::StepTokenOrder step_order = {}) {
  const auto& plan = *static_cast<const AttentionPlan*>(state.data.get());
  return cuda::launch_planned_attention(plan, params, scratch, static_cast<cudaStream_t>(context.stream()), step_order);
}

Status run_decode(const Context& context, const PlanState& state, const SparseDecodeArgs& args,
                  const detail::DecodeShape& shape, void* scratch) {
  SMLA_RETURN_IF_ERROR(check_devices(context, args));
  auto params = kernel_params(detail::decode_operands(args, shape), "tokens");
  if (!params) return params.status();
  const cuda::StepTokenOrder step_order{args.token_order.present() ? args.token_order.ptr<int>() : nullptr,
                                        args.token_order_ready};
  return launch(context, state, *params, scratch, step_order);
}

Status run_prefill(const Context& context, const PlanState& state, const SparsePrefillArgs& args,
                   const detail::PrefillShape& shape, void* scratch) {
  SMLA_RETURN_IF_ERROR(check_devices(context, args));
  auto params = kernel_params(detail::prefill_operands(args, shape), "queries");
  if (!params) return params.status();
  return launch(context, state, *params, scratch);
}

bool prefers_sm90_tiles(const Context& context, const Problem& problem) {
  return cuda::sm90_tiles_preferred(attention_shape(problem), context.device());
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
