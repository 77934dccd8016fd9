// smla::Model: what one step enqueues in the model's context (step metadata,
// then every layer), written once for every backend: the ops run on the
// context's backend, the bytes move through the model's memory.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "smla/attention.h"
#include "smla/compressor.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/metadata.h"
#include "src/runtime/model/model_impl.h"
#include "src/runtime/model/model_kernels.h"

namespace smla {

using model_detail::Buffer;
using model_detail::kHeadDim;
using model_detail::ModelLayer;
using model_detail::StepShape;

namespace {

// A layer type's place in Activations::token_orders.
std::size_t token_order_slot(LayerType type) {
  switch (type) {
    case LayerType::kSwaOnly: return 0;
    case LayerType::kC4A: return 1;
    case LayerType::kC128A: return 2;
  }
  return 0;
}

}  // namespace

Status Model::Impl::mark(std::size_t index, const StepShape& shape) {
  return shape.timed ? memory->mark(index) : Status::Ok();
}

Status Model::Impl::linear(const Buffer& in_gemm, std::int64_t rows, const model_detail::WeightMatrix& w,
                           const Buffer& out) const {
  // Buffers are sized at creation; a mismatch here is a bug, never a silent overflow.
  if (in_gemm.bytes < static_cast<std::size_t>(rows * w.cols) * dtype_size(gemm_dtype) ||
      out.bytes < static_cast<std::size_t>(rows * w.rows) * 4) {
    return internal_error(fmt::format("Model: GEMM [{} x {}] . [{} x {}]^T does not fit its buffers ({} / {} bytes)",
                                      rows, w.cols, w.rows, w.cols, in_gemm.bytes, out.bytes));
  }
  model_detail::LinearArgs a;
  a.in = in_gemm.get();
  a.weight = w.mem.get();
  a.out = out.get<float>();
  a.rows = rows;
  a.n = w.rows;
  a.k = w.cols;
  a.row_stable = options.row_stable;
  a.workspace = act.gemm_workspace.get();
  a.workspace_bytes = act.gemm_workspace.bytes;
  return model_detail::linear(*context, a);
}

StepMetadataBuffers Model::Impl::metadata_buffers(std::int64_t T) const {
  const std::int64_t R = options.max_requests;
  StepMetadataBuffers b;
  b.query_start_loc = view(md.query_start_loc, DType::kI32, {R + 1});
  b.token_to_req = view(md.token_to_req, DType::kI32, {T});
  b.positions = view(md.positions, DType::kI64, {T});
  b.is_valid_token = view(md.is_valid_token, DType::kU8, {T});
  b.swa_slot_mapping = view(md.swa_slot_mapping, DType::kI64, {T});
  b.swa_indices = view(md.swa_indices, DType::kI32, {T, config.window});
  b.swa_lens = view(md.swa_lens, DType::kI32, {T});
  b.prefill_gather_lens = view(md.prefill_gather_lens, DType::kI32, {R});
  b.c4_slot_mapping = view(md.c4_slot_mapping, DType::kI64, {T});
  b.c128_slot_mapping = view(md.c128_slot_mapping, DType::kI64, {T});
  b.c128a_decode_indices = view(md.c128a_decode_indices, DType::kI32, {T, c128_width});
  b.c128a_decode_lens = view(md.c128a_decode_lens, DType::kI32, {T});
  b.c128a_prefill_indices = view(md.c128a_prefill_indices, DType::kI32, {T, c128_width});
  return b;
}

Status Model::Impl::enqueue_metadata(const StepShape& shape) {
  const std::int64_t R = shape.requests, T = shape.tokens;
  StepMetadataBuffers out = metadata_buffers(T);
  out.query_start_loc.shape[0] = R + 1;
  out.prefill_gather_lens.shape[0] = R;
  SMLA_RETURN_IF_ERROR(build_step_metadata(*context, staged_batch(R, T), step_config, out,
                                           view(md.counts, DType::kI64, {kStepCountFields})));
  cuda_model::StateSlotParams p;
  p.token_to_req = md.token_to_req.get<std::int32_t>();
  p.positions = md.positions.get<std::int64_t>();
  p.is_valid = md.is_valid_token.get<std::uint8_t>();
  p.tokens = T;
  p.groups[0] = {in.c4_state_table.get<std::int32_t>(), R, c4_state_cols, compressor_state_block_size(4),
                 md.c4_state_slots.get<std::int64_t>()};
  p.groups[1] = {in.c128_state_table.get<std::int32_t>(), R, c128_state_cols, compressor_state_block_size(128),
                 md.c128_state_slots.get<std::int64_t>()};
  return model_detail::state_slots(*context, p);
}

Status Model::Impl::enqueue_step(const StepShape& shape) {
  SMLA_RETURN_IF_ERROR(mark(0, shape));
  SMLA_RETURN_IF_ERROR(enqueue_metadata(shape).with_context("step metadata: "));
  SMLA_RETURN_IF_ERROR(mark(1, shape));
  // The first layer's GEMM input: x in the GEMM dtype.
  SMLA_RETURN_IF_ERROR(model_detail::row_norm(
      *context,
      {.in = act.x.get<float>(), .out_gemm = act.x_in.get(), .rows = shape.tokens, .width = config.hidden,
       .normalize = false}));
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    Status s = enqueue_layer(l, shape);
    if (!s.ok()) {
      return s.with_context(fmt::format("layer {} ({}): ", l, layer_type_name(layers[static_cast<std::size_t>(l)].type)));
    }
  }
  return Status::Ok();
}

Status Model::Impl::enqueue_layer(int l, const StepShape& shape) {
  ModelLayer& layer = layers[static_cast<std::size_t>(l)];
  SMLA_RETURN_IF_ERROR(project(layer, shape.tokens));
  SMLA_RETURN_IF_ERROR(mark(model_detail::layer_mark(l, 1), shape));
  SMLA_RETURN_IF_ERROR(write_caches(layer, shape));
  SMLA_RETURN_IF_ERROR(mark(model_detail::layer_mark(l, 2), shape));
  SMLA_RETURN_IF_ERROR(select_compressed(layer, shape));
  SMLA_RETURN_IF_ERROR(mark(model_detail::layer_mark(l, 3), shape));
  SMLA_RETURN_IF_ERROR(attend(layer, l, shape));
  SMLA_RETURN_IF_ERROR(mark(model_detail::layer_mark(l, 4), shape));
  SMLA_RETURN_IF_ERROR(output(layer, shape.tokens));
  return mark(model_detail::layer_mark(l, 5), shape);
}

// 1. Projections (GEMM-dtype inputs and weights, f32 out) and the q/kv RMSNorms.
Status Model::Impl::project(const ModelLayer& layer, std::int64_t T) {
  SMLA_RETURN_IF_ERROR(linear(act.x_in, T, layer.wq_a, act.qr).with_context("wq_a: "));
  SMLA_RETURN_IF_ERROR(model_detail::row_norm(
      *context, {.in = act.qr.get<float>(), .weight = layer.q_norm.get<float>(), .out_gemm = act.qr_in.get(),
                 .rows = T, .width = config.q_lora_rank, .eps = config.rms_eps}));
  SMLA_RETURN_IF_ERROR(linear(act.x_in, T, layer.wkv, act.kv).with_context("wkv: "));
  SMLA_RETURN_IF_ERROR(model_detail::row_norm(
      *context, {.in = act.kv.get<float>(), .weight = layer.kv_norm.get<float>(), .out_f32 = act.kv.get<float>(),
                 .rows = T, .width = kHeadDim, .eps = config.rms_eps}));
  SMLA_RETURN_IF_ERROR(linear(act.qr_in, T, layer.wq_b, act.q).with_context("wq_b: "));
  if (layer.type != LayerType::kSwaOnly) {
    SMLA_RETURN_IF_ERROR(
        linear(act.x_in, T, layer.compressor.wkv_wgate, act.kv_score).with_context("compressor wkv_wgate: "));
  }
  if (layer.type == LayerType::kC4A) {
    SMLA_RETURN_IF_ERROR(linear(act.qr_in, T, layer.index_wq_b, act.index_q).with_context("index_wq_b: "));
    SMLA_RETURN_IF_ERROR(
        linear(act.x_in, T, layer.index_weights_proj, act.index_w).with_context("index_weights_proj: "));
    SMLA_RETURN_IF_ERROR(linear(act.x_in, T, layer.index_compressor.wkv_wgate, act.index_kv_score)
                             .with_context("index compressor wkv_wgate: "));
  }
  return Status::Ok();
}

// One compressor: the layer's (attention cache) or, with `indexer`, the
// indexer's (key cache).
Status Model::Impl::compress(const ModelLayer& layer, const StepShape& shape, bool indexer) {
  const std::int64_t R = shape.requests, T = shape.tokens;
  const int r = indexer ? 4 : static_cast<int>(layer.type);
  const int head_dim = indexer ? 128 : kHeadDim;
  const model_detail::CompressorBuffers& cw = indexer ? layer.index_compressor : layer.compressor;
  const std::int64_t bs = compressor_state_block_size(r);
  const std::int64_t width = compressor_state_width(r, head_dim);
  CompressorArgs args;
  args.ratio = r;
  args.kv_score = view(indexer ? act.index_kv_score : act.kv_score, DType::kF32, {T, width});
  args.ape = view(cw.ape, DType::kF32, {r, compressor_coff(r) * head_dim});
  args.norm_weight = view(cw.norm, DType::kF32, {head_dim});
  args.positions = view(md.positions, DType::kI64, {T});
  args.token_to_request = view(md.token_to_req, DType::kI32, {T});
  args.state_cache = indexer ? view(layer.index_state, DType::kF32, {layer.index_state_blocks, bs, width})
                             : view(layer.state, DType::kF32, {layer.state_blocks, bs, width});
  args.state_block_table = r == 4 ? view(in.c4_state_table, DType::kI32, {R, c4_state_cols})
                                  : view(in.c128_state_table, DType::kI32, {R, c128_state_cols});
  args.state_slot_mapping = view(r == 4 ? md.c4_state_slots : md.c128_state_slots, DType::kI64, {T});
  args.compressed_slot_mapping = view(r == 4 ? md.c4_slot_mapping : md.c128_slot_mapping, DType::kI64, {T});
  args.rope = &rope_of(layer);
  args.eps = config.rms_eps;
  if (indexer) {
    args.index_cache = index_view(layer.index_keys);
  } else {
    args.kv_cache = kv_view(layer.compressed);
  }
  return run_compressor(*context, args).with_context(indexer ? "indexer compressor: " : "compressor: ");
}

// 2. Query prep, SWA insert, the attention-cache compressor.
Status Model::Impl::write_caches(ModelLayer& layer, const StepShape& shape) {
  const std::int64_t T = shape.tokens, H = config.num_heads;
  const TensorView pos = view(md.positions, DType::kI64, {T});
  SMLA_RETURN_IF_ERROR(prepare_query(*context, {view(act.q, DType::kF32, {T, H, kHeadDim}), pos, &rope_of(layer),
                                                config.rms_eps, view(act.q_bf16, DType::kBF16, {T, H, kHeadDim})}));
  SMLA_RETURN_IF_ERROR(prepare_kv(*context, {view(act.kv, DType::kF32, {T, kHeadDim}), pos, &rope_of(layer),
                                             view(md.swa_slot_mapping, DType::kI64, {T}), kv_view(layer.swa), {}}));
  if (layer.type != LayerType::kSwaOnly) SMLA_RETURN_IF_ERROR(compress(layer, shape, false));
  return Status::Ok();
}

// 3. Compressed-entry selection: indexer top-k (C4A) or every entry (C128A).
Status Model::Impl::select_compressed(ModelLayer& layer, const StepShape& shape) {
  const std::int64_t R = shape.requests, T = shape.tokens, Hi = config.index_heads, EW = layer.extra_width;
  const TensorView req_of_token = view(md.token_to_req, DType::kI32, {T});
  if (layer.type == LayerType::kC4A) {
    SMLA_RETURN_IF_ERROR(compress(layer, shape, true));
    const TensorView q_fp8 = view(act.q8, DType::kE4M3, {T, Hi, 128});
    const TensorView weights = view(act.head_weights, DType::kF32, {T, Hi});
    const TensorView pos = view(md.positions, DType::kI64, {T});
    SMLA_RETURN_IF_ERROR(prepare_indexer_query(*context, {view(act.index_q, DType::kF32, {T, Hi, 128}),
                                                          view(act.index_w, DType::kF32, {T, Hi}), pos,
                                                          &rope_of(layer), q_fp8, weights}));
    const TensorView c4_blocks = view(in.c4_table, DType::kI32, {R, c_cols});
    const TensorView local = view(act.local_topk, DType::kI32, {T, EW});
    SMLA_RETURN_IF_ERROR(indexer_topk(
        *context, {q_fp8, weights, index_view(layer.index_keys), pos, req_of_token, c4_blocks, -1, true, local}));
    return c4a_global_topk_indices(*context, local, req_of_token, view(md.is_valid_token, DType::kU8, {T}),
                                   c4_blocks, layer.compressed.page_size, view(act.extra_indices, DType::kI32, {T, EW}),
                                   view(act.extra_lens, DType::kI32, {T}))
        .with_context("c4a global indices: ");
  }
  if (layer.type != LayerType::kC128A) return Status::Ok();
  // Decode rows come global from the metadata; prefill rows are local
  // (0..n-1) and go through the ratio-128 table.
  const std::int64_t dec = shape.decode_tokens, pre = shape.prefill_tokens;
  if (dec > 0) {
    SMLA_RETURN_IF_ERROR(memory->copy(act.extra_indices.get(), md.c128a_decode_indices.get(),
                                      static_cast<std::size_t>(dec * EW) * 4));
    SMLA_RETURN_IF_ERROR(
        memory->copy(act.extra_lens.get(), md.c128a_decode_lens.get(), static_cast<std::size_t>(dec) * 4));
  }
  if (pre == 0) return Status::Ok();
  return c4a_global_topk_indices(*context, view(md.c128a_prefill_indices, DType::kI32, {pre, EW}),
                                 view(md.token_to_req, DType::kI32, {pre}, dec),
                                 view(md.is_valid_token, DType::kU8, {pre}, dec),
                                 view(in.c128_table, DType::kI32, {R, c_cols}), layer.compressed.page_size,
                                 view(act.extra_indices, DType::kI32, {pre, EW}, dec),
                                 view(act.extra_lens, DType::kI32, {pre}, dec))
      .with_context("c128a prefill indices: ");
}

SparseDecodeArgs Model::Impl::attention_args(const ModelLayer& layer, std::int64_t T) const {
  const std::int64_t H = config.num_heads;
  SparseDecodeArgs a;
  a.q = view(act.q_bf16, DType::kBF16, {T, H, kHeadDim});
  a.main_cache = kv_view(layer.swa);
  a.main_indices = view(md.swa_indices, DType::kI32, {T, config.window});
  a.main_lengths = view(md.swa_lens, DType::kI32, {T});
  if (layer.type != LayerType::kSwaOnly) {
    a.extra_cache = kv_view(layer.compressed);
    a.extra_indices = view(act.extra_indices, DType::kI32, {T, layer.extra_width});
    a.extra_lengths = view(act.extra_lens, DType::kI32, {T});
  }
  a.sink = view(layer.sink, DType::kF32, {H});
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  a.out = view(act.o, DType::kBF16, {T, H, kHeadDim});
  a.token_order = view(act.token_orders[token_order_slot(layer.type)], DType::kI32, {T});
  return a;
}

bool Model::Impl::token_order_written_before(int l) const {
  const LayerType type = layers[static_cast<std::size_t>(l)].type;
  return std::any_of(layers.begin(), layers.begin() + l, [type](const ModelLayer& earlier) { return earlier.type == type; });
}

Expected<const AttentionPlan*> Model::Impl::attention_plan(const ModelLayer& layer, const SparseDecodeArgs& args,
                                                           std::int64_t tokens) {
  const auto key = std::make_pair(layer.type, tokens);
  if (auto found = attention_plans.find(key); found != attention_plans.end()) return &found->second;
  constexpr std::size_t kMaxPlans = 64;  // many prefill sizes: keep the table small, plans are cheap to redo
  if (attention_plans.size() >= kMaxPlans) attention_plans.clear();
  auto plan = plan_sparse_decode(*context, args);
  if (!plan) return plan.status();
  return &attention_plans.emplace(key, std::move(*plan)).first->second;
}

// 4. Sparse attention: every token is a row over the paged caches; the
// sampled rows are staged for verification.
Status Model::Impl::attend(const ModelLayer& layer, int l, const StepShape& shape) {
  SparseDecodeArgs args = attention_args(layer, shape.tokens);
  // The layers of one type share their lengths within a step (and a stale order would only be slower).
  args.token_order_ready = token_order_written_before(l);
  auto plan = attention_plan(layer, args, shape.tokens);
  if (!plan) return plan.status().with_context("sparse_decode plan: ");
  SMLA_RETURN_IF_ERROR(sparse_decode(*context, **plan, args).with_context("sparse_decode: "));
  const model_detail::VerifyStage& v = verify_stage[static_cast<std::size_t>(l)];
  const std::int64_t q_row = static_cast<std::int64_t>(config.num_heads) * kHeadDim * 2;
  auto copy_row = [&](const Buffer& dst, std::int64_t dst_row, const Buffer& src, std::int64_t src_row,
                      std::int64_t row_bytes) {
    return memory->copy(dst.get<std::uint8_t>() + dst_row * row_bytes, src.get<std::uint8_t>() + src_row * row_bytes,
                        static_cast<std::size_t>(row_bytes));
  };
  for (std::size_t i = 0; i < shape.verify_rows.size(); ++i) {
    const auto dst = static_cast<std::int64_t>(i);
    const std::int64_t src = shape.verify_rows[i];
    SMLA_RETURN_IF_ERROR(copy_row(v.q, dst, act.q_bf16, src, q_row));
    SMLA_RETURN_IF_ERROR(copy_row(v.o, dst, act.o, src, q_row));
    SMLA_RETURN_IF_ERROR(copy_row(v.swa_indices, dst, md.swa_indices, src, config.window * 4));
    SMLA_RETURN_IF_ERROR(copy_row(v.swa_lens, dst, md.swa_lens, src, 4));
    if (layer.type != LayerType::kSwaOnly) {
      SMLA_RETURN_IF_ERROR(copy_row(v.extra_indices, dst, act.extra_indices, src, layer.extra_width * 4));
      SMLA_RETURN_IF_ERROR(copy_row(v.extra_lens, dst, act.extra_lens, src, 4));
    }
  }
  return Status::Ok();
}

OutputProjectionArgs Model::Impl::output_args(const ModelLayer& layer, std::int64_t T) const {
  const std::int64_t H = config.num_heads, G = config.o_groups;
  OutputProjectionArgs p;
  p.o = view(act.o, DType::kBF16, {T, H, kHeadDim});
  p.num_heads = static_cast<int>(H);
  p.positions = view(md.positions, DType::kI64, {T});
  p.rope = &rope_of(layer);
  p.wo_a = view(layer.wo_a, gemm_dtype, {G, config.o_lora_rank, H / G * kHeadDim});
  p.wo_b = view(layer.wo_b, gemm_dtype, {config.hidden, G * config.o_lora_rank});
  p.out = view(act.layer_out, DType::kF32, {T, config.hidden});
  p.row_stable = options.row_stable;
  return p;
}

// 5. Output projection, then the next layer's input RMSNorm(x + out) (f32 and
// its GEMM-dtype copy).
Status Model::Impl::output(const ModelLayer& layer, std::int64_t T) {
  SMLA_RETURN_IF_ERROR(project_output(*context, output_args(layer, T)));
  return model_detail::row_norm(*context, {.in = act.x.get<float>(),
                                           .addend = act.layer_out.get<float>(),
                                           .out_f32 = act.x.get<float>(),
                                           .out_gemm = act.x_in.get(),
                                           .rows = T,
                                           .width = config.hidden,
                                           .eps = config.rms_eps});
}

}  // namespace smla
