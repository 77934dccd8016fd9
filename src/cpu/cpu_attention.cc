#include "src/cpu/cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <new>

#include <fmt/format.h>

#include "src/cpu/attention_params.h"
#include "src/cpu/thread_pool.h"

namespace smla::cpu {

namespace {

// Work items are (token, head group). Below kMinItemsForThreads tokens the
// heads are split so small batches still feed every thread; the split depends
// on the shape only, and a head's result never depends on its group anyway.
constexpr std::int64_t kMinItemsForThreads = 16;
constexpr std::int64_t kHeadGroupAlign = 6;  // the kernel's head tile
// Longest row the kernel's per-thread buffers are sized for (V3.2: 576).
constexpr int kMaxHeadDim = 1024;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Status run_attention(const AttentionParams& params) {
  if (params.d_qk <= 0 || params.d_qk > kMaxHeadDim || params.d_v <= 0 || params.d_v > params.d_qk) {
    return unimplemented(fmt::format("cpu attention: d_qk {} with d_v {} (supported: 0 < d_v <= d_qk <= {})",
                                     params.d_qk, params.d_v, kMaxHeadDim));
  }
  const std::int64_t tokens = params.num_tokens;
  const std::int64_t heads = params.num_heads;
  if (tokens <= 0 || heads <= 0) return Status::Ok();
  std::int64_t groups = 1;
  if (tokens < kMinItemsForThreads) {
    groups = std::min(ceil_div(heads, kHeadGroupAlign), ceil_div(kMinItemsForThreads, tokens));
  }
  const std::int64_t group_heads = ceil_div(ceil_div(heads, groups), kHeadGroupAlign) * kHeadGroupAlign;
  groups = ceil_div(heads, group_heads);

  std::atomic<bool> failed{false};
  parallel_for(tokens * groups, [&](std::int64_t item, int /*worker*/) {
    const std::int64_t token = item / groups;
    const std::int64_t head_begin = (item % groups) * group_heads;
    try {
      attend_token_heads(params, token, head_begin, std::min(heads, head_begin + group_heads));
    } catch (const std::bad_alloc&) {
      failed.store(true);
    }
  });
  if (failed.load()) return internal_error("cpu attention: out of memory for per-thread buffers");
  return Status::Ok();
}

KeySetParams paged_set(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths) {
  KeySetParams set;
  set.indices = indices.ptr<const std::int32_t>();
  set.stride_indices_t = indices.stride[0];
  set.width = indices.shape[1];
  if (lengths.present()) {
    set.lengths = lengths.ptr<const std::int32_t>();
    set.stride_lengths = lengths.stride[0];
  }
  set.base = static_cast<const std::uint8_t*>(cache.pages.data);
  set.num_rows = cache.num_slots();
  set.page_size = cache.page_size();
  set.page_stride_bytes = cache.page_stride_bytes();
  set.fp8_scale = cache.fp8_scale;
  return set;
}

void set_outputs(AttentionParams* p, const TensorView& q, const TensorView& sink, const TensorView& out,
                 const TensorView& lse) {
  p->q = q.ptr<const std::uint16_t>();
  p->stride_q_t = q.stride[0];
  p->stride_q_h = q.stride[1];
  if (sink.present()) {
    p->sink = sink.ptr<const float>();
    p->stride_sink = sink.stride[0];
  }
  p->out = out.ptr<std::uint16_t>();
  p->stride_out_t = out.stride[0];
  p->stride_out_h = out.stride[1];
  if (lse.present()) {
    p->lse = lse.ptr<float>();
    p->stride_lse_t = lse.stride[0];
    p->stride_lse_h = lse.stride[1];
  }
}

Status run_guarded(const AttentionParams& params, const char* op) {
  try {
    return run_attention(params).with_context(op);
  } catch (const std::exception& e) {  // thread creation or allocation failures
    return internal_error(fmt::format("{}cpu backend: {}", op, e.what()));
  }
}

}  // namespace

Status sparse_decode(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  AttentionParams p;
  p.source = RowSource::kPagedCache;
  p.format = args.main_cache.format;
  p.num_tokens = shape.num_tokens;
  p.num_heads = shape.num_heads;
  p.d_qk = shape.d_qk;
  p.d_v = shape.d_v;
  p.softmax_scale = args.softmax_scale;
  set_outputs(&p, args.q, args.sink, args.out, args.lse);
  p.sets[0] = paged_set(args.main_cache, args.main_indices, args.main_lengths);
  p.num_sets = 1;
  if (shape.has_extra && args.extra_cache.has_value()) {
    p.sets[1] = paged_set(*args.extra_cache, args.extra_indices, args.extra_lengths);
    p.num_sets = 2;
  }
  return run_guarded(p, "sparse_decode: ");
}

Status sparse_prefill(const SparsePrefillArgs& args, const detail::PrefillShape& shape) {
  AttentionParams p;
  p.source = RowSource::kFlatBf16;
  p.num_tokens = shape.num_queries;
  p.num_heads = shape.num_heads;
  p.d_qk = shape.d_qk;
  p.d_v = shape.d_v;
  p.softmax_scale = args.softmax_scale;
  set_outputs(&p, args.q, args.sink, args.out, args.lse);
  if (args.max_logits.present()) {
    p.max_logits = args.max_logits.ptr<float>();
    p.stride_max_t = args.max_logits.stride[0];
    p.stride_max_h = args.max_logits.stride[1];
  }
  KeySetParams& set = p.sets[0];
  set.indices = args.indices.ptr<const std::int32_t>();
  set.stride_indices_t = args.indices.stride[0];
  set.width = shape.topk;
  if (args.topk_length.present()) {
    set.lengths = args.topk_length.ptr<const std::int32_t>();
    set.stride_lengths = args.topk_length.stride[0];
  }
  set.base = static_cast<const std::uint8_t*>(args.kv.data);
  set.num_rows = shape.num_kv;
  set.row_stride_bytes = args.kv.stride[0] * static_cast<std::int64_t>(dtype_size(args.kv.dtype));
  p.num_sets = 1;
  return run_guarded(p, "sparse_prefill: ");
}

}  // namespace smla::cpu
