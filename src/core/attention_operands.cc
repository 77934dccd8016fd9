#include "src/core/attention_operands.h"

#include <cstddef>

namespace smla::detail {

namespace {

std::int64_t stride_bytes(const TensorView& view, int dim) {
  return view.stride[static_cast<std::size_t>(dim)] * static_cast<std::int64_t>(dtype_size(view.dtype));
}

void set_indices(const TensorView& indices, std::int64_t width, const TensorView& lengths, KeySetOperands* set) {
  set->indices = indices.ptr<const std::int32_t>();
  set->stride_indices_t = indices.stride[0];
  set->width = width;
  if (lengths.present()) {
    set->lengths = lengths.ptr<const std::int32_t>();
    set->stride_lengths_t = lengths.stride[0];
  }
}

KeySetOperands paged_set(const char* argument_name, const KvCacheView& cache, const TensorView& indices,
                         std::int64_t width, const TensorView& lengths) {
  KeySetOperands set;
  set.argument_name = argument_name;
  set.pages = static_cast<const std::uint8_t*>(cache.pages.data);
  set.num_pages = cache.num_pages();
  set.page_size = cache.page_size();
  set.page_stride_bytes = cache.page_stride_bytes();
  set.row_stride_bytes = stride_bytes(cache.pages, 1);
  set.num_slots = cache.num_slots();
  set.fp8_scale = cache.fp8_scale;
  set_indices(indices, width, lengths, &set);
  return set;
}

// What decode and prefill share: the shape, q, sink, out and lse (Args: either op's).
template <class Args>
AttentionOperands common_operands(const Args& args, std::int64_t num_tokens, std::int64_t num_heads, int d_qk,
                                  int d_v) {
  AttentionOperands ops;
  ops.num_tokens = num_tokens;
  ops.num_heads = num_heads;
  ops.d_qk = d_qk;
  ops.d_v = d_v;
  ops.softmax_scale = args.softmax_scale;
  const TensorView& q = args.q;
  const TensorView& sink = args.sink;
  const TensorView& out = args.out;
  const TensorView& lse = args.lse;
  ops.q = q.ptr<const std::uint16_t>();
  ops.stride_q_t = q.stride[0];
  ops.stride_q_h = q.stride[1];
  if (sink.present()) {
    ops.sink = sink.ptr<const float>();
    ops.stride_sink = sink.stride[0];
  }
  ops.out = out.ptr<std::uint16_t>();
  ops.stride_out_t = out.stride[0];
  ops.stride_out_h = out.stride[1];
  if (lse.present()) {
    ops.lse = lse.ptr<float>();
    ops.stride_lse_t = lse.stride[0];
    ops.stride_lse_h = lse.stride[1];
  }
  return ops;
}

}  // namespace

AttentionOperands decode_operands(const SparseDecodeArgs& args, const DecodeShape& shape) {
  AttentionOperands ops = common_operands(args, shape.num_tokens, shape.num_heads, shape.d_qk, shape.d_v);
  ops.source = RowSource::kPagedCache;
  ops.format = args.main_cache.format;
  ops.sets[0] = paged_set("main_cache", args.main_cache, args.main_indices, shape.main_topk, args.main_lengths);
  if (shape.has_extra && args.extra_cache.has_value()) {
    ops.sets[1] =
        paged_set("extra_cache", *args.extra_cache, args.extra_indices, shape.extra_topk, args.extra_lengths);
    ops.num_sets = 2;
  }
  return ops;
}

AttentionOperands prefill_operands(const SparsePrefillArgs& args, const PrefillShape& shape) {
  AttentionOperands ops = common_operands(args, shape.num_queries, shape.num_heads, shape.d_qk, shape.d_v);
  ops.source = RowSource::kFlatBf16;
  if (args.max_logits.present()) {
    ops.max_logits = args.max_logits.ptr<float>();
    ops.stride_max_t = args.max_logits.stride[0];
    ops.stride_max_h = args.max_logits.stride[1];
  }
  KeySetOperands& set = ops.sets[0];
  set.argument_name = "kv";
  set.pages = static_cast<const std::uint8_t*>(args.kv.data);
  set.page_size = shape.num_kv > 0 ? shape.num_kv : 1;  // >= 1 even for s_kv = 0: slots divide by it
  set.row_stride_bytes = stride_bytes(args.kv, 0);
  set.num_slots = shape.num_kv;
  set_indices(args.indices, shape.topk, args.topk_length, &set);
  return ops;
}

}  // namespace smla::detail
