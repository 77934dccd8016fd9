// Internal: the state of smla::Model (weights, caches, activations and step
// inputs at fixed addresses in the context's memory, the page bookkeeping)
// shared by its translation units: model.cc (creation, requests, caches),
// model_alloc.cc (buffers, weights, workspace), model_layer.cc (what a step
// enqueues) and model_step.cc (steps, verification, the decode graph).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <memory>
#include <optional>
#include <vector>

#include "smla/attention.h"
#include "smla/context.h"
#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "smla/layer.h"
#include "smla/metadata.h"
#include "smla/model.h"
#include "smla/rope.h"
#include "src/runtime/model/model_common.h"
#include "src/runtime/model/model_memory.h"

namespace smla::model_detail {

inline constexpr int kHeadDim = V4Fp8Format::kHeadDim;
inline constexpr int kLogicalBlock = kModelLogicalBlock;
inline constexpr int kSwaPage = kModelSwaPage;

inline std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// A weight matrix [rows, cols] in the GEMM dtype (gemm_dtype(context)).
struct WeightMatrix {
  Buffer mem;
  std::int64_t rows = 0, cols = 0;
};

struct CompressorBuffers {
  WeightMatrix wkv_wgate;  // [2*coff*d, hidden]
  Buffer ape, norm;        // f32 [r, coff*d], [d]
};

// A paged byte cache; the page stride is aligned to V4Fp8Format::kPageAlign.
struct PagedBuffer {
  Buffer mem;
  std::int64_t pages = 0, page_size = 0, page_stride = 0;
};

struct ModelLayer {
  LayerType type = LayerType::kSwaOnly;
  WeightMatrix wq_a, wkv, wq_b, index_wq_b, index_weights_proj;
  Buffer wo_a, wo_b;  // GEMM dtype [G, rank, H/G*512], [hidden, G*rank]
  Buffer q_norm, kv_norm, sink;
  CompressorBuffers compressor, index_compressor;
  PagedBuffer swa, compressed, index_keys;
  Buffer state, index_state;  // f32 compressor state caches [blocks, bs, width]
  std::int64_t state_blocks = 0, index_state_blocks = 0;
  std::int64_t extra_width = 0;  // compressed indices per token: K (C4A), C128 width (C128A), 0
};

// Host-known shape of one enqueued step. Graph steps are decode-only, so the
// decode/prefill split is known without reading values in the context's memory.
struct StepShape {
  std::int64_t requests = 0, tokens = 0, decode_tokens = 0, prefill_tokens = 0;
  std::vector<std::int64_t> verify_rows;  // sampled rows to stage for verification (empty: none)
  bool timed = false;                      // record the phase marks
};

// Sampled attention rows of one layer, copied during the step.
struct VerifyStage {
  Buffer q, swa_indices, swa_lens, extra_indices, extra_lens, o;
};

// Step inputs at fixed addresses (R = max_requests rows) and their host staging.
struct StepInputs {
  Buffer query_lens, seq_lens, swa_table, c4_table, c128_table, c4_state_table, c128_state_table;
  std::vector<std::int32_t> h_query_lens, h_seq_lens, h_swa_table, h_c4_table, h_c128_table, h_c4_state_table,
      h_c128_state_table;
};

// Step metadata (T = max_batched_tokens rows) and the per-step state slots.
struct StepMetadataMem {
  Buffer query_start_loc, token_to_req, positions, is_valid_token, swa_slot_mapping, swa_indices, swa_lens,
      prefill_gather_lens, c4_slot_mapping, c128_slot_mapping, c128a_decode_indices, c128a_decode_lens,
      c128a_prefill_indices, counts, c4_state_slots, c128_state_slots;
};

// Activations (T rows). x_in, qr_in: the GEMM-dtype copies fed to the projections.
struct Activations {
  Buffer x, x_in, layer_out, qr, qr_in, kv, q, q_bf16, kv_score, index_q, index_w, index_kv_score, q8, head_weights,
      local_topk, extra_indices, extra_lens, o;
  // The attention's token order of each layer type (SparseDecodeArgs::token_order): the step's
  // first layer of a type writes it, the later ones of that type read it.
  std::array<Buffer, 3> token_orders;
  Buffer workspace, gemm_workspace;  // op workspace (max of the *_workspace_size queries), cuBLASLt scratch
};

// Phase marks: [step start, metadata end, then 5 per layer], then the replay pair.
inline std::size_t layer_mark(int layer, int phase) { return 1 + 5 * static_cast<std::size_t>(layer) + phase; }

}  // namespace smla::model_detail

namespace smla {

struct Model::Impl {
  ModelConfig config;
  ModelOptions options;
  StepConfig step_config;
  KvFormatInfo format{};
  std::optional<Context> context;  // every op of a step runs in it
  // The attention plan of each layer type for the last token count planned:
  // every layer of that type, and every step of that many tokens (decode steps,
  // graph capture), runs it without planning again.
  std::map<std::pair<LayerType, std::int64_t>, AttentionPlan> attention_plans;
  std::unique_ptr<model_detail::ModelMemory> memory;
  DType gemm_dtype = DType::kF32;
  std::optional<RopeTable> swa_rope, compressed_rope;
  StepTiming timing;

  std::vector<model_detail::ModelLayer> layers;
  std::vector<model_detail::RequestState> requests;
  model_detail::PagePool swa_pool, c4_pool, c128_pool, c4_state_pool, c128_state_pool;
  std::int64_t c4_ring_blocks = 0, c128_ring_blocks = 0;
  // Fixed block-table widths (columns for max_model_len), so every step has the same table shapes.
  std::int64_t swa_cols = 0, c_cols = 0, c4_state_cols = 0, c128_state_cols = 0;
  std::int64_t c128_width = 0;

  model_detail::StepInputs in;
  model_detail::StepMetadataMem md;
  model_detail::Activations act;
  std::vector<model_detail::VerifyStage> verify_stage;
  std::size_t replay_mark = 0;  // first of the two replay marks
  int graph_requests = 0;

  ~Impl();

  // views of the model's memory
  TensorView view(const model_detail::Buffer& mem, DType dtype, std::initializer_list<std::int64_t> shape,
                  std::int64_t row_offset = 0) const;
  KvCacheView kv_view(const model_detail::PagedBuffer& cache) const;
  IndexerCacheView index_view(const model_detail::PagedBuffer& cache) const;
  const RopeTable& rope_of(const model_detail::ModelLayer& layer) const;

  // create() (model_alloc.cc)
  Status init_pools();
  Status allocate_caches();
  Status allocate_step_buffers();
  Status allocate_activations();
  Status upload_weights(int layer_index);
  Status size_workspaces();
  Status warm_up();

  // step pieces (model_step.cc)
  Status validate_batch(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out,
                        std::int64_t* tokens) const;
  Status stage_batch(const std::vector<StepEntry>& batch);  // pages + tables on the host, then upload
  Expected<model_detail::StepShape> prepare_step(const std::vector<StepEntry>& batch, const TensorView& x,
                                                 const TensorView& out);
  BatchDescription staged_batch(std::int64_t requests, std::int64_t tokens) const;
  BatchDescription host_batch(std::int64_t requests) const;
  Status finish_step(const std::vector<StepEntry>& batch, const TensorView& out, std::int64_t tokens);
  Status verify_step(const model_detail::StepShape& shape, StepStats& stats);
  void collect_phase_times(StepStats& stats) const;
  Status check_metadata_errors() const;

  // what a step enqueues (model_layer.cc)
  StepMetadataBuffers metadata_buffers(std::int64_t tokens) const;
  Status enqueue_step(const model_detail::StepShape& shape);
  Status enqueue_metadata(const model_detail::StepShape& shape);
  Status enqueue_layer(int l, const model_detail::StepShape& shape);
  Status project(const model_detail::ModelLayer& layer, std::int64_t tokens);
  Status write_caches(model_detail::ModelLayer& layer, const model_detail::StepShape& shape);
  Status select_compressed(model_detail::ModelLayer& layer, const model_detail::StepShape& shape);
  Status attend(const model_detail::ModelLayer& layer, int l, const model_detail::StepShape& shape);
  Status output(const model_detail::ModelLayer& layer, std::int64_t tokens);
  Status linear(const model_detail::Buffer& in, std::int64_t rows, const model_detail::WeightMatrix& w,
                const model_detail::Buffer& out) const;
  Status compress(const model_detail::ModelLayer& layer, const model_detail::StepShape& shape, bool indexer);
  SparseDecodeArgs attention_args(const model_detail::ModelLayer& layer, std::int64_t tokens) const;
  // Whether an earlier layer of the step has `layer`'s type (its token order is then written already).
  bool token_order_written_before(int layer) const;
  // The layer type's plan for `tokens` tokens (made on first use).
  Expected<const AttentionPlan*> attention_plan(const model_detail::ModelLayer& layer, const SparseDecodeArgs& args,
                                                std::int64_t tokens);
  OutputProjectionArgs output_args(const model_detail::ModelLayer& layer, std::int64_t tokens) const;
  Status mark(std::size_t index, const model_detail::StepShape& shape);
};

}  // namespace smla
