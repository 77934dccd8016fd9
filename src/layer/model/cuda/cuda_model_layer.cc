// smla::CudaModel: what one step enqueues on the model's stream (metadata and
// every layer), plus the workspace sizing and warm-up done at creation.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "smla/compressor.h"
#include "smla/attention.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/metadata.h"
#include "src/cuda/cublaslt_gemm.h"
#include "src/layer/model/cuda/cuda_model_impl.h"
#include "src/layer/model/cuda/cuda_model_kernels.h"

namespace smla {

using cuda_model::DeviceMem;
using cuda_model::kHeadDim;

namespace {

// Row copies between device buffers of [rows, row_bytes] layout.
Status copy_row(void* dst, std::int64_t dst_row, const void* src, std::int64_t src_row, std::int64_t row_bytes,
                cudaStream_t stream) {
  return cuda_status(cudaMemcpyAsync(static_cast<std::uint8_t*>(dst) + dst_row * row_bytes,
                                     static_cast<const std::uint8_t*>(src) + src_row * row_bytes,
                                     static_cast<std::size_t>(row_bytes), cudaMemcpyDeviceToDevice, stream),
                     "device row copy");
}

}  // namespace

Status CudaModel::Impl::linear(const DeviceMem& in_bf16, std::int64_t rows, const cuda_model::DeviceMatrix& w,
                               const DeviceMem& out) const {
  // Buffers are sized at creation; a mismatch here is a bug, never a silent overflow.
  if (in_bf16.bytes < static_cast<std::size_t>(rows * w.cols) * 2 ||
      out.bytes < static_cast<std::size_t>(rows * w.rows) * 4) {
    return internal_error(
        fmt::format("CudaModel: GEMM [{} x {}] . [{} x {}]^T does not fit its buffers ({} / {} bytes)", rows, w.cols,
                    w.rows, w.cols, in_bf16.bytes, out.bytes));
  }
  cuda::GemmArgs g;
  g.m = rows;
  g.n = w.rows;
  g.k = w.cols;
  g.input_dtype = DType::kBF16;
  g.a = in_bf16.get();
  g.lda = w.cols;
  g.b = w.mem.get();
  g.ldb = w.cols;
  g.out_dtype = DType::kF32;
  g.out = out.get();
  g.ldc = w.rows;
  g.workspace = gemm_workspace.get();
  g.workspace_bytes = gemm_workspace.bytes;
  g.stream = stream;
  return cuda::cublaslt_gemm(g);
}

StepMetadataBuffers CudaModel::Impl::device_metadata_buffers(std::int64_t T) const {
  const std::int64_t R = options.max_requests;
  StepMetadataBuffers b;
  b.query_start_loc = dev(query_start_loc, DType::kI32, {R + 1});
  b.token_to_req = dev(token_to_req, DType::kI32, {T});
  b.positions = dev(positions, DType::kI64, {T});
  b.is_valid_token = dev(is_valid_token, DType::kU8, {T});
  b.swa_slot_mapping = dev(swa_slot_mapping, DType::kI64, {T});
  b.swa_indices = dev(swa_indices, DType::kI32, {T, config.window});
  b.swa_lens = dev(swa_lens, DType::kI32, {T});
  b.prefill_gather_lens = dev(prefill_gather_lens, DType::kI32, {R});
  b.c4_slot_mapping = dev(c4_slot_mapping, DType::kI64, {T});
  b.c128_slot_mapping = dev(c128_slot_mapping, DType::kI64, {T});
  b.c128a_decode_indices = dev(c128a_decode_indices, DType::kI32, {T, c128_width});
  b.c128a_decode_lens = dev(c128a_decode_lens, DType::kI32, {T});
  b.c128a_prefill_indices = dev(c128a_prefill_indices, DType::kI32, {T, c128_width});
  return b;
}

Status CudaModel::Impl::enqueue_metadata(const cuda_model::StepShape& shape) {
  const std::int64_t R = shape.requests, T = shape.tokens;
  StepMetadataBuffers out = device_metadata_buffers(T);
  out.query_start_loc.shape[0] = R + 1;
  out.prefill_gather_lens.shape[0] = R;
  SMLA_RETURN_IF_ERROR(build_step_metadata(*context, device_batch(R, T), step_config, out,
                                           dev(counts, DType::kI64, {kStepCountFields})));
  cuda_model::StateSlotParams p;
  p.token_to_req = token_to_req.get<std::int32_t>();
  p.positions = positions.get<std::int64_t>();
  p.is_valid = is_valid_token.get<std::uint8_t>();
  p.tokens = T;
  p.groups[0] = {c4_state_table.get<std::int32_t>(), R, c4_state_cols, compressor_state_block_size(4),
                 c4_state_slots.get<std::int64_t>()};
  p.groups[1] = {c128_state_table.get<std::int32_t>(), R, c128_state_cols, compressor_state_block_size(128),
                 c128_state_slots.get<std::int64_t>()};
  return cuda_model::launch_state_slots(p, stream);
}

Status CudaModel::Impl::enqueue_layer(int l, const cuda_model::StepShape& shape) {
  cuda_model::DeviceLayer& layer = layers[static_cast<std::size_t>(l)];
  const std::int64_t R = shape.requests, T = shape.tokens;
  const std::int64_t H = config.num_heads, Hi = config.index_heads, W = config.window;
  const int ratio = static_cast<int>(layer.type);
  const RopeTable& rope = ratio == 1 ? *swa_rope : *compressed_rope;
  const std::size_t ev = 1 + 5 * static_cast<std::size_t>(l);
  const TensorView pos = dev(positions, DType::kI64, {T});
  const TensorView req_of_token = dev(token_to_req, DType::kI32, {T});
  const TensorView valid = dev(is_valid_token, DType::kU8, {T});

  // 1. Projections (bf16 activations and weights, f32 out) and norms.
  if (l == 0) {
    cuda_model::RowNormParams convert;
    convert.in = x.get<float>();
    convert.stride_in = config.hidden;
    convert.out_bf16 = x_bf16.get<std::uint16_t>();
    convert.stride_out_bf16 = config.hidden;
    convert.rows = T;
    convert.width = config.hidden;
    convert.normalize = false;
    SMLA_RETURN_IF_ERROR(cuda_model::launch_row_norm(convert, stream));
  }
  SMLA_RETURN_IF_ERROR(linear(x_bf16, T, layer.wq_a, qr).with_context("wq_a: "));
  cuda_model::RowNormParams q_norm;
  q_norm.in = qr.get<float>();
  q_norm.stride_in = config.q_lora_rank;
  q_norm.weight = layer.q_norm.get<float>();
  q_norm.out_bf16 = qr_bf16.get<std::uint16_t>();
  q_norm.stride_out_bf16 = config.q_lora_rank;
  q_norm.rows = T;
  q_norm.width = config.q_lora_rank;
  q_norm.eps = config.rms_eps;
  SMLA_RETURN_IF_ERROR(cuda_model::launch_row_norm(q_norm, stream));
  SMLA_RETURN_IF_ERROR(linear(x_bf16, T, layer.wkv, kv).with_context("wkv: "));
  cuda_model::RowNormParams kv_norm;
  kv_norm.in = kv.get<float>();
  kv_norm.stride_in = kHeadDim;
  kv_norm.weight = layer.kv_norm.get<float>();
  kv_norm.out_f32 = kv.get<float>();
  kv_norm.stride_out_f32 = kHeadDim;
  kv_norm.rows = T;
  kv_norm.width = kHeadDim;
  kv_norm.eps = config.rms_eps;
  SMLA_RETURN_IF_ERROR(cuda_model::launch_row_norm(kv_norm, stream));
  SMLA_RETURN_IF_ERROR(linear(qr_bf16, T, layer.wq_b, q).with_context("wq_b: "));
  if (ratio > 1) {
    SMLA_RETURN_IF_ERROR(
        linear(x_bf16, T, layer.compressor.wkv_wgate, kv_score).with_context("compressor wkv_wgate: "));
  }
  if (ratio == 4) {
    SMLA_RETURN_IF_ERROR(linear(qr_bf16, T, layer.index_wq_b, index_q).with_context("index_wq_b: "));
    SMLA_RETURN_IF_ERROR(linear(x_bf16, T, layer.index_weights_proj, index_w).with_context("index_weights_proj: "));
    SMLA_RETURN_IF_ERROR(linear(x_bf16, T, layer.index_compressor.wkv_wgate, index_kv_score)
                             .with_context("index compressor wkv_wgate: "));
  }
  SMLA_RETURN_IF_ERROR(record(ev + 1, shape));

  // 2. Query prep, SWA insert, compressors.
  SMLA_RETURN_IF_ERROR(prepare_query(*context, {dev(q, DType::kF32, {T, H, kHeadDim}), pos, &rope, config.rms_eps,
                                                dev(q_bf16, DType::kBF16, {T, H, kHeadDim})}));
  SMLA_RETURN_IF_ERROR(prepare_kv(*context, {dev(kv, DType::kF32, {T, kHeadDim}), pos, &rope,
                                             dev(swa_slot_mapping, DType::kI64, {T}), kv_view(layer.swa), {}}));
  auto compress = [&](int r, int head_dim, const DeviceMem& scores, const cuda_model::DeviceCompressor& cw,
                      const DeviceMem& state, std::int64_t state_blocks, std::optional<KvCacheView> kv_dest,
                      std::optional<IndexerCacheView> index_dest) -> Status {
    const std::int64_t bs = compressor_state_block_size(r);
    const std::int64_t width = compressor_state_width(r, head_dim);
    CompressorArgs args;
    args.ratio = r;
    args.kv_score = dev(scores, DType::kF32, {T, width});
    args.ape = dev(cw.ape, DType::kF32, {r, compressor_coff(r) * head_dim});
    args.norm_weight = dev(cw.norm, DType::kF32, {head_dim});
    args.positions = pos;
    args.token_to_request = req_of_token;
    args.state_cache = dev(state, DType::kF32, {state_blocks, bs, width});
    args.state_block_table = r == 4 ? dev(c4_state_table, DType::kI32, {R, c4_state_cols})
                                    : dev(c128_state_table, DType::kI32, {R, c128_state_cols});
    args.state_slot_mapping = dev(r == 4 ? c4_state_slots : c128_state_slots, DType::kI64, {T});
    args.compressed_slot_mapping = dev(r == 4 ? c4_slot_mapping : c128_slot_mapping, DType::kI64, {T});
    args.rope = &rope;
    args.eps = config.rms_eps;
    args.kv_cache = kv_dest;
    args.index_cache = index_dest;
    return run_compressor(*context, args);
  };
  if (ratio > 1) {
    SMLA_RETURN_IF_ERROR(compress(ratio, kHeadDim, kv_score, layer.compressor, layer.state, layer.state_blocks,
                                  kv_view(layer.compressed), std::nullopt)
                             .with_context("compressor: "));
  }
  SMLA_RETURN_IF_ERROR(record(ev + 2, shape));

  // 3. Compressed-entry selection: indexer top-k (C4A) or every entry (C128A).
  const std::int64_t EW = layer.extra_width;
  if (ratio == 4) {
    const IndexerCacheView keys = index_view(layer.index_keys);
    SMLA_RETURN_IF_ERROR(compress(4, 128, index_kv_score, layer.index_compressor, layer.index_state,
                                  layer.index_state_blocks, std::nullopt, keys)
                             .with_context("indexer compressor: "));
    const TensorView q_fp8 = dev(q8, DType::kE4M3, {T, Hi, 128});
    const TensorView weights = dev(head_weights, DType::kF32, {T, Hi});
    SMLA_RETURN_IF_ERROR(prepare_indexer_query(
        *context, {dev(index_q, DType::kF32, {T, Hi, 128}), dev(index_w, DType::kF32, {T, Hi}), pos, &rope, q_fp8,
                   weights}));
    const TensorView c4_blocks = dev(c4_table, DType::kI32, {R, c_cols});
    IndexerTopkArgs topk{q_fp8, weights, keys, pos, req_of_token, c4_blocks, -1, true,
                         dev(local_topk, DType::kI32, {T, EW})};
    SMLA_RETURN_IF_ERROR(indexer_topk(*context, topk));
    SMLA_RETURN_IF_ERROR(c4a_global_topk_indices(*context, dev(local_topk, DType::kI32, {T, EW}), req_of_token, valid,
                                                 c4_blocks, layer.compressed.page_size,
                                                 dev(extra_indices, DType::kI32, {T, EW}),
                                                 dev(extra_lens, DType::kI32, {T}))
                             .with_context("c4a global indices: "));
  } else if (ratio == 128) {
    // Decode rows come global from the metadata; prefill rows are local
    // (0..n-1) and go through the ratio-128 table (as Model).
    const std::int64_t dec = shape.decode_tokens, pre = shape.prefill_tokens;
    if (dec > 0) {
      SMLA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(extra_indices.get(), c128a_decode_indices.get(),
                                                       static_cast<std::size_t>(dec * EW) * 4,
                                                       cudaMemcpyDeviceToDevice, stream),
                                       "c128a decode rows copy"));
      SMLA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(extra_lens.get(), c128a_decode_lens.get(),
                                                       static_cast<std::size_t>(dec) * 4, cudaMemcpyDeviceToDevice,
                                                       stream),
                                       "c128a decode lens copy"));
    }
    if (pre > 0) {
      SMLA_RETURN_IF_ERROR(c4a_global_topk_indices(
                               *context, dev(c128a_prefill_indices, DType::kI32, {pre, EW}),
                               dev(token_to_req, DType::kI32, {pre}, dec), dev(is_valid_token, DType::kU8, {pre}, dec),
                               dev(c128_table, DType::kI32, {R, c_cols}), layer.compressed.page_size,
                               dev(extra_indices, DType::kI32, {pre, EW}, dec),
                               dev(extra_lens, DType::kI32, {pre}, dec))
                               .with_context("c128a prefill indices: "));
    }
  }
  SMLA_RETURN_IF_ERROR(record(ev + 3, shape));

  // 4. Sparse attention: every token is a row over the paged caches.
  SparseDecodeArgs a;
  a.q = dev(q_bf16, DType::kBF16, {T, H, kHeadDim});
  a.main_cache = kv_view(layer.swa);
  a.main_indices = dev(swa_indices, DType::kI32, {T, W});
  a.main_lengths = dev(swa_lens, DType::kI32, {T});
  if (ratio > 1) {
    a.extra_cache = kv_view(layer.compressed);
    a.extra_indices = dev(extra_indices, DType::kI32, {T, EW});
    a.extra_lengths = dev(extra_lens, DType::kI32, {T});
  }
  a.sink = dev(layer.sink, DType::kF32, {H});
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  a.out = dev(o, DType::kBF16, {T, H, kHeadDim});
  SMLA_RETURN_IF_ERROR(sparse_decode(*context, a).with_context("sparse_decode: "));
  if (!shape.verify_rows.empty()) {
    const VerifyStage& v = verify_stage[static_cast<std::size_t>(l)];
    const std::int64_t q_row = H * kHeadDim * 2;
    for (std::size_t i = 0; i < shape.verify_rows.size(); ++i) {
      const auto dst = static_cast<std::int64_t>(i);
      const std::int64_t src = shape.verify_rows[i];
      SMLA_RETURN_IF_ERROR(copy_row(v.q.get(), dst, q_bf16.get(), src, q_row, stream));
      SMLA_RETURN_IF_ERROR(copy_row(v.o.get(), dst, o.get(), src, q_row, stream));
      SMLA_RETURN_IF_ERROR(copy_row(v.swa_indices.get(), dst, swa_indices.get(), src, W * 4, stream));
      SMLA_RETURN_IF_ERROR(copy_row(v.swa_lens.get(), dst, swa_lens.get(), src, 4, stream));
      if (ratio > 1) {
        SMLA_RETURN_IF_ERROR(copy_row(v.extra_indices.get(), dst, extra_indices.get(), src, EW * 4, stream));
        SMLA_RETURN_IF_ERROR(copy_row(v.extra_lens.get(), dst, extra_lens.get(), src, 4, stream));
      }
    }
  }
  SMLA_RETURN_IF_ERROR(record(ev + 4, shape));

  // 5. Output projection, then the next layer's input RMSNorm(x + out) (f32 and bf16).
  const std::int64_t G = config.o_groups;
  OutputProjectionArgs p;
  p.o = dev(o, DType::kBF16, {T, H, kHeadDim});
  p.num_heads = static_cast<int>(H);
  p.positions = pos;
  p.rope = &rope;
  p.wo_a = dev(layer.wo_a, DType::kBF16, {G, config.o_lora_rank, H / G * kHeadDim});
  p.wo_b = dev(layer.wo_b, DType::kBF16, {config.hidden, G * config.o_lora_rank});
  p.out = dev(layer_out, DType::kF32, {T, config.hidden});
  SMLA_RETURN_IF_ERROR(project_output(*context, p));
  cuda_model::RowNormParams residual;
  residual.in = x.get<float>();
  residual.stride_in = config.hidden;
  residual.addend = layer_out.get<float>();
  residual.stride_addend = config.hidden;
  residual.out_f32 = x.get<float>();
  residual.stride_out_f32 = config.hidden;
  residual.out_bf16 = x_bf16.get<std::uint16_t>();
  residual.stride_out_bf16 = config.hidden;
  residual.rows = T;
  residual.width = config.hidden;
  residual.eps = config.rms_eps;
  SMLA_RETURN_IF_ERROR(cuda_model::launch_row_norm(residual, stream));
  return record(ev + 5, shape);
}

Status CudaModel::Impl::size_workspaces() {
  const std::int64_t T_max = options.max_batched_tokens;
  const std::int64_t R = options.max_requests;
  const std::int64_t H = config.num_heads, Hi = config.index_heads, G = config.o_groups;
  std::size_t bytes = 0;
  auto take = [&bytes](Expected<std::size_t> size) -> Status {
    if (!size) return size.status();
    bytes = std::max(bytes, *size);
    return Status::Ok();
  };
  for (const cuda_model::DeviceLayer& layer : layers) {
    const int ratio = static_cast<int>(layer.type);
    const RopeTable& rope = ratio == 1 ? *swa_rope : *compressed_rope;
    // The attention split plan depends on the token count (fewer rows may
    // split further), so every count a step may have is asked.
    for (std::int64_t T = 1; T <= T_max; ++T) {
      SparseDecodeArgs a;
      a.q = dev(q_bf16, DType::kBF16, {T, H, kHeadDim});
      a.main_cache = kv_view(layer.swa);
      a.main_indices = dev(swa_indices, DType::kI32, {T, config.window});
      a.main_lengths = dev(swa_lens, DType::kI32, {T});
      if (ratio > 1) {
        a.extra_cache = kv_view(layer.compressed);
        a.extra_indices = dev(extra_indices, DType::kI32, {T, layer.extra_width});
        a.extra_lengths = dev(extra_lens, DType::kI32, {T});
      }
      a.sink = dev(layer.sink, DType::kF32, {H});
      a.softmax_scale = 1.0f;
      a.out = dev(o, DType::kBF16, {T, H, kHeadDim});
      SMLA_RETURN_IF_ERROR(take(sparse_decode_workspace_size(*context, a)).with_context("sparse_decode workspace: "));
    }
    const TensorView pos = dev(positions, DType::kI64, {T_max});
    if (ratio == 4) {
      IndexerTopkArgs topk{dev(q8, DType::kE4M3, {T_max, Hi, 128}), dev(head_weights, DType::kF32, {T_max, Hi}),
                           index_view(layer.index_keys), pos, dev(token_to_req, DType::kI32, {T_max}),
                           dev(c4_table, DType::kI32, {R, c_cols}), -1, true,
                           dev(local_topk, DType::kI32, {T_max, layer.extra_width})};
      SMLA_RETURN_IF_ERROR(take(indexer_topk_workspace_size(*context, topk)).with_context("indexer_topk workspace: "));
    }
    OutputProjectionArgs p;
    p.o = dev(o, DType::kBF16, {T_max, H, kHeadDim});
    p.num_heads = static_cast<int>(H);
    p.positions = pos;
    p.rope = &rope;
    p.wo_a = dev(layer.wo_a, DType::kBF16, {G, config.o_lora_rank, H / G * kHeadDim});
    p.wo_b = dev(layer.wo_b, DType::kBF16, {config.hidden, G * config.o_lora_rank});
    p.out = dev(layer_out, DType::kF32, {T_max, config.hidden});
    SMLA_RETURN_IF_ERROR(take(project_output_workspace_size(*context, p)).with_context("project_output workspace: "));
  }
  SMLA_RETURN_IF_ERROR(cuda_model::allocate(workspace, bytes, "op workspace"));
  context->set_workspace(workspace.get(), workspace.bytes);  // every op's scratch: nothing allocates in a step
  return Status::Ok();
}

// The first cuBLASLt call on a device creates its handle, which must not
// happen during graph capture: one tiny GEMM and one output projection now.
Status CudaModel::Impl::warm_up() {
  const cuda_model::DeviceLayer& layer = layers.front();
  SMLA_RETURN_IF_ERROR(linear(x_bf16, 1, layer.wq_a, qr).with_context("warm-up GEMM: "));
  const std::int64_t H = config.num_heads, G = config.o_groups;
  OutputProjectionArgs p;
  p.o = dev(o, DType::kBF16, {1, H, kHeadDim});
  p.num_heads = static_cast<int>(H);
  p.positions = dev(positions, DType::kI64, {1});
  p.rope = layer.type == LayerType::kSwaOnly ? &*swa_rope : &*compressed_rope;
  p.wo_a = dev(layer.wo_a, DType::kBF16, {G, config.o_lora_rank, H / G * kHeadDim});
  p.wo_b = dev(layer.wo_b, DType::kBF16, {config.hidden, G * config.o_lora_rank});
  p.out = dev(layer_out, DType::kF32, {1, config.hidden});
  SMLA_RETURN_IF_ERROR(project_output(*context, p).with_context("warm-up: "));
  return cuda_status(cudaStreamSynchronize(stream), "warm-up");
}

}  // namespace smla
