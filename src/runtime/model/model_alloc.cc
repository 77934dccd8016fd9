// smla::Model creation: every buffer in the context's memory (caches, step
// inputs, metadata, activations, verification staging), the seeded weights,
// the op workspace and the warm-up.
#include <fmt/format.h>

#include <algorithm>

#include "smla/compressor.h"
#include "smla/indexer.h"
#include "smla/numeric.h"
#include "src/runtime/model/model_impl.h"
#include "src/runtime/model/model_kernels.h"
#include "src/runtime/model/model_weights.h"

namespace smla {

using model_detail::Buffer;
using model_detail::cdiv;
using model_detail::kHeadDim;
using model_detail::kLogicalBlock;
using model_detail::kSwaPage;

namespace {

std::size_t i32(std::int64_t n) { return static_cast<std::size_t>(n) * 4; }
std::size_t i64(std::int64_t n) { return static_cast<std::size_t>(n) * 8; }

Status allocate_inputs(model_detail::ModelMemory& memory, model_detail::StepInputs& in, std::int64_t R,
                       std::int64_t swa_cols, std::int64_t c_cols, std::int64_t c4_state_cols,
                       std::int64_t c128_state_cols) {
  SMLA_RETURN_IF_ERROR(memory.allocate(in.query_lens, i32(R), "query_lens"));
  SMLA_RETURN_IF_ERROR(memory.allocate(in.seq_lens, i32(R), "seq_lens"));
  SMLA_RETURN_IF_ERROR(memory.allocate(in.swa_table, i32(R * swa_cols), "swa block table"));
  SMLA_RETURN_IF_ERROR(memory.allocate(in.c4_table, i32(R * c_cols), "c4 block table"));
  SMLA_RETURN_IF_ERROR(memory.allocate(in.c128_table, i32(R * c_cols), "c128 block table"));
  SMLA_RETURN_IF_ERROR(memory.allocate(in.c4_state_table, i32(R * c4_state_cols), "c4 state table"));
  SMLA_RETURN_IF_ERROR(memory.allocate(in.c128_state_table, i32(R * c128_state_cols), "c128 state table"));
  in.h_query_lens.assign(static_cast<std::size_t>(R), 0);
  in.h_seq_lens.assign(static_cast<std::size_t>(R), 0);
  in.h_swa_table.assign(static_cast<std::size_t>(R * swa_cols), 0);
  in.h_c4_table.assign(static_cast<std::size_t>(R * c_cols), 0);
  in.h_c128_table.assign(static_cast<std::size_t>(R * c_cols), 0);
  in.h_c4_state_table.assign(static_cast<std::size_t>(R * c4_state_cols), 0);
  in.h_c128_state_table.assign(static_cast<std::size_t>(R * c128_state_cols), 0);
  return Status::Ok();
}

}  // namespace

Status Model::Impl::allocate_caches() {
  auto make_paged = [&](model_detail::PagedBuffer& cache, std::int64_t pages, std::int64_t page_size,
                        std::int64_t content, const char* what) {
    cache.pages = pages;
    cache.page_size = page_size;
    cache.page_stride = cdiv(content, V4Fp8Format::kPageAlign) * V4Fp8Format::kPageAlign;
    return memory->allocate(cache.mem, static_cast<std::size_t>(pages * cache.page_stride), what);
  };
  for (auto& layer : layers) {
    SMLA_RETURN_IF_ERROR(
        make_paged(layer.swa, swa_pool.capacity, kSwaPage, format.bytes_per_token * kSwaPage, "swa cache"));
    const int ratio = static_cast<int>(layer.type);
    if (ratio > 1) {
      const std::int64_t page_size = kLogicalBlock / ratio;
      SMLA_RETURN_IF_ERROR(make_paged(layer.compressed, ratio == 4 ? c4_pool.capacity : c128_pool.capacity, page_size,
                                      format.bytes_per_token * page_size, "compressed cache"));
      layer.state_blocks = ratio == 4 ? c4_state_pool.capacity : c128_state_pool.capacity;
      SMLA_RETURN_IF_ERROR(memory->allocate(
          layer.state,
          static_cast<std::size_t>(layer.state_blocks * compressor_state_block_size(ratio) *
                                   compressor_state_width(ratio, kHeadDim)) * 4,
          "compressor state"));
      layer.extra_width = ratio == 4 ? config.index_topk : c128_width;
    }
    if (ratio == 4) {
      SMLA_RETURN_IF_ERROR(make_paged(layer.index_keys, c4_pool.capacity, kLogicalBlock / 4,
                                      IndexerFp8Format::page_content_bytes(kLogicalBlock / 4), "indexer key cache"));
      layer.index_state_blocks = c4_state_pool.capacity;
      SMLA_RETURN_IF_ERROR(memory->allocate(
          layer.index_state,
          static_cast<std::size_t>(layer.index_state_blocks * compressor_state_block_size(4) *
                                   compressor_state_width(4, 128)) * 4,
          "indexer compressor state"));
    }
  }
  return Status::Ok();
}

Status Model::Impl::allocate_step_buffers() {
  const std::int64_t R = options.max_requests;
  const std::int64_t T = options.max_batched_tokens;
  SMLA_RETURN_IF_ERROR(
      allocate_inputs(*memory, in, R, swa_cols, c_cols, c4_state_cols, c128_state_cols));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.query_start_loc, i32(R + 1), "query_start_loc"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.token_to_req, i32(T), "token_to_req"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.positions, i64(T), "positions"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.is_valid_token, static_cast<std::size_t>(T), "is_valid_token"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.swa_slot_mapping, i64(T), "swa_slot_mapping"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.swa_indices, i32(T * config.window), "swa_indices"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.swa_lens, i32(T), "swa_lens"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.prefill_gather_lens, i32(R), "prefill_gather_lens"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c4_slot_mapping, i64(T), "c4_slot_mapping"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c128_slot_mapping, i64(T), "c128_slot_mapping"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c128a_decode_indices, i32(T * c128_width), "c128a_decode_indices"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c128a_decode_lens, i32(T), "c128a_decode_lens"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c128a_prefill_indices, i32(T * c128_width), "c128a_prefill_indices"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.counts, i64(32), "step counts"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c4_state_slots, i64(T), "c4 state slots"));
  SMLA_RETURN_IF_ERROR(memory->allocate(md.c128_state_slots, i64(T), "c128 state slots"));

  // Verification staging and the phase marks.
  const std::int64_t n = options.verify_rows;
  const std::int64_t row = static_cast<std::int64_t>(config.num_heads) * kHeadDim;
  verify_stage.resize(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    model_detail::VerifyStage& v = verify_stage[l];
    SMLA_RETURN_IF_ERROR(memory->allocate(v.q, static_cast<std::size_t>(n * row) * 2, "verify q"));
    SMLA_RETURN_IF_ERROR(memory->allocate(v.o, static_cast<std::size_t>(n * row) * 2, "verify o"));
    SMLA_RETURN_IF_ERROR(memory->allocate(v.swa_indices, i32(n * config.window), "verify swa indices"));
    SMLA_RETURN_IF_ERROR(memory->allocate(v.swa_lens, i32(n), "verify swa lens"));
    SMLA_RETURN_IF_ERROR(memory->allocate(
        v.extra_indices, i32(n * std::max<std::int64_t>(layers[l].extra_width, 1)), "verify extra indices"));
    SMLA_RETURN_IF_ERROR(memory->allocate(v.extra_lens, i32(n), "verify extra lens"));
  }
  replay_mark = 2 + 5 * layers.size();
  return memory->make_marks(replay_mark + 2);
}

Status Model::Impl::allocate_activations() {
  const std::int64_t T = options.max_batched_tokens;
  const std::int64_t H = config.num_heads, Hi = config.index_heads;
  const std::size_t gemm = dtype_size(gemm_dtype);
  // [kv | score] rows of the widest compressor (the ratio-4 one overlaps windows).
  std::int64_t score_width = 0, max_extra = 1;
  for (const auto& layer : layers) {
    if (layer.type != LayerType::kSwaOnly) {
      score_width = std::max<std::int64_t>(score_width, compressor_state_width(static_cast<int>(layer.type), kHeadDim));
    }
    max_extra = std::max(max_extra, layer.extra_width);
  }
  auto rows = [T](std::int64_t width, std::size_t elem) { return static_cast<std::size_t>(T * width) * elem; };
  auto& a = act;
  SMLA_RETURN_IF_ERROR(memory->allocate(a.x, rows(config.hidden, 4), "x"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.x_in, rows(config.hidden, gemm), "x (GEMM input)"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.layer_out, rows(config.hidden, 4), "layer output"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.qr, rows(config.q_lora_rank, 4), "qr"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.qr_in, rows(config.q_lora_rank, gemm), "qr (GEMM input)"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.kv, rows(kHeadDim, 4), "kv"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.q, rows(H * kHeadDim, 4), "q"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.q_bf16, rows(H * kHeadDim, 2), "q bf16"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.kv_score, rows(score_width, 4), "kv_score"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.index_q, rows(Hi * 128, 4), "index q"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.index_w, rows(Hi, 4), "index weights"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.index_kv_score, rows(compressor_state_width(4, 128), 4), "index kv_score"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.q8, rows(Hi * 128, 1), "index q fp8"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.head_weights, rows(Hi, 4), "index head weights"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.local_topk, rows(config.index_topk, 4), "local top-k"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.extra_indices, rows(max_extra, 4), "extra indices"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.extra_lens, rows(1, 4), "extra lens"));
  SMLA_RETURN_IF_ERROR(memory->allocate(a.o, rows(H * kHeadDim, 2), "attention output"));
  for (Buffer& order : a.token_orders) SMLA_RETURN_IF_ERROR(memory->allocate(order, rows(1, 4), "token order"));
  return memory->allocate(a.gemm_workspace, model_detail::linear_workspace_bytes(*context), "GEMM workspace");
}

namespace {

// Uploads host values (bf16-exact f32) as f32 or as bf16 bits, then waits (the
// host copy is a temporary).
Status upload_values(model_detail::ModelMemory& memory, Buffer& dst, const std::vector<float>& values, DType dtype,
                     const char* what) {
  if (dtype == DType::kBF16) {
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(values[i]);  // exact: values are bf16
    SMLA_RETURN_IF_ERROR(memory.allocate(dst, bits.size() * 2, what));
    SMLA_RETURN_IF_ERROR(memory.upload(dst.get(), bits.data(), bits.size() * 2));
  } else {
    SMLA_RETURN_IF_ERROR(memory.allocate(dst, values.size() * 4, what));
    SMLA_RETURN_IF_ERROR(memory.upload(dst.get(), values.data(), values.size() * 4));
  }
  return memory.synchronize();
}

Status upload_matrix(model_detail::ModelMemory& memory, model_detail::WeightMatrix& dst,
                     const model_detail::Matrix& m, DType dtype, const char* what) {
  dst.rows = m.rows;
  dst.cols = m.cols;
  return upload_values(memory, dst.mem, m.values, dtype, what);
}

Status upload_compressor(model_detail::ModelMemory& memory, model_detail::CompressorBuffers& dst,
                         const model_detail::CompressorWeights& w, DType dtype) {
  SMLA_RETURN_IF_ERROR(upload_matrix(memory, dst.wkv_wgate, w.wkv_wgate, dtype, "compressor wkv_wgate"));
  SMLA_RETURN_IF_ERROR(upload_values(memory, dst.ape, w.ape, DType::kF32, "compressor ape"));
  return upload_values(memory, dst.norm, w.norm, DType::kF32, "compressor norm");
}

}  // namespace

Status Model::Impl::upload_weights(int l) {
  model_detail::ModelLayer& layer = layers[static_cast<std::size_t>(l)];
  const model_detail::LayerWeights w = model_detail::make_layer_weights(config, l, options.seed);
  model_detail::ModelMemory& mem = *memory;
  const DType g = gemm_dtype;
  SMLA_RETURN_IF_ERROR(upload_matrix(mem, layer.wq_a, w.wq_a, g, "wq_a"));
  SMLA_RETURN_IF_ERROR(upload_matrix(mem, layer.wkv, w.wkv, g, "wkv"));
  SMLA_RETURN_IF_ERROR(upload_matrix(mem, layer.wq_b, w.wq_b, g, "wq_b"));
  SMLA_RETURN_IF_ERROR(upload_values(mem, layer.q_norm, w.q_norm, DType::kF32, "q_norm"));
  SMLA_RETURN_IF_ERROR(upload_values(mem, layer.kv_norm, w.kv_norm, DType::kF32, "kv_norm"));
  SMLA_RETURN_IF_ERROR(upload_values(mem, layer.sink, w.sink, DType::kF32, "sink"));
  SMLA_RETURN_IF_ERROR(upload_values(mem, layer.wo_a, w.wo_a, g, "wo_a"));
  SMLA_RETURN_IF_ERROR(upload_values(mem, layer.wo_b, w.wo_b.values, g, "wo_b"));
  if (layer.type != LayerType::kSwaOnly) SMLA_RETURN_IF_ERROR(upload_compressor(mem, layer.compressor, w.compressor, g));
  if (layer.type == LayerType::kC4A) {
    SMLA_RETURN_IF_ERROR(upload_matrix(mem, layer.index_wq_b, w.index_wq_b, g, "index_wq_b"));
    SMLA_RETURN_IF_ERROR(upload_matrix(mem, layer.index_weights_proj, w.index_weights_proj, g, "index_weights_proj"));
    SMLA_RETURN_IF_ERROR(upload_compressor(mem, layer.index_compressor, w.index_compressor, g));
  }
  return Status::Ok();
}

// Device contexts: one op workspace, the maximum of every *_workspace_size
// query, set on the model's context so nothing allocates during a step (or a
// graph capture). The attention split plan depends on the token count (fewer
// rows may split further), so every count a step may have is asked. Host
// contexts keep the context's own scratch.
Status Model::Impl::size_workspaces() {
  if (memory->device().kind == DeviceKind::kCpu) return Status::Ok();
  const std::int64_t T_max = options.max_batched_tokens;
  std::size_t bytes = 0;
  auto take = [&bytes](Expected<std::size_t> size) -> Status {
    if (!size) return size.status();
    bytes = std::max(bytes, *size);
    return Status::Ok();
  };
  for (const model_detail::ModelLayer& layer : layers) {
    for (std::int64_t T = 1; T <= T_max; ++T) {
      SMLA_RETURN_IF_ERROR(
          take(sparse_decode_workspace_size(*context, attention_args(layer, T))).with_context("sparse_decode workspace: "));
    }
    if (layer.type == LayerType::kC4A) {
      const std::int64_t Hi = config.index_heads;
      IndexerTopkArgs topk{view(act.q8, DType::kE4M3, {T_max, Hi, 128}),
                           view(act.head_weights, DType::kF32, {T_max, Hi}),
                           index_view(layer.index_keys),
                           view(md.positions, DType::kI64, {T_max}),
                           view(md.token_to_req, DType::kI32, {T_max}),
                           view(in.c4_table, DType::kI32, {options.max_requests, c_cols}),
                           -1,
                           true,
                           view(act.local_topk, DType::kI32, {T_max, layer.extra_width})};
      SMLA_RETURN_IF_ERROR(take(indexer_topk_workspace_size(*context, topk)).with_context("indexer_topk workspace: "));
    }
    SMLA_RETURN_IF_ERROR(
        take(project_output_workspace_size(*context, output_args(layer, T_max))).with_context("project_output workspace: "));
  }
  SMLA_RETURN_IF_ERROR(memory->allocate(act.workspace, bytes, "op workspace"));
  context->set_workspace(act.workspace.get(), act.workspace.bytes);
  return Status::Ok();
}

// The first cuBLASLt call on a device creates its handle, which must not
// happen during graph capture: one tiny GEMM and one output projection now.
Status Model::Impl::warm_up() {
  const model_detail::ModelLayer& layer = layers.front();
  SMLA_RETURN_IF_ERROR(linear(act.x_in, 1, layer.wq_a, act.qr).with_context("warm-up GEMM: "));
  SMLA_RETURN_IF_ERROR(project_output(*context, output_args(layer, 1)).with_context("warm-up: "));
  return memory->synchronize();
}

}  // namespace smla
