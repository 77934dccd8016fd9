// Internal: state of smla::CudaModel (device weights, caches, activations,
// step inputs at fixed addresses) shared by its translation units.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "smla/context.h"
#include "smla/cuda_model.h"
#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "smla/metadata.h"
#include "smla/rope.h"
#include "src/layer/model/model_common.h"

namespace smla::cuda_model {

inline constexpr int kHeadDim = V4Fp8Format::kHeadDim;
inline constexpr int kLogicalBlock = model_detail::kModelLogicalBlock;
inline constexpr int kSwaPage = model_detail::kModelSwaPage;

inline std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

// One device allocation (zero-filled at creation, so nothing reads
// uninitialized memory).
struct DeviceMem {
  std::unique_ptr<void, CudaFree> ptr;
  std::size_t bytes = 0;
  template <class T = void>
  T* get() const { return static_cast<T*>(ptr.get()); }
};
Status allocate(DeviceMem& mem, std::size_t bytes, const char* what);

// A bf16 weight matrix [rows, cols] on the device.
struct DeviceMatrix {
  DeviceMem mem;
  std::int64_t rows = 0, cols = 0;
};

struct DeviceCompressor {
  DeviceMatrix wkv_wgate;  // [2*coff*d, hidden]
  DeviceMem ape, norm;     // f32 [r, coff*d], [d]
};

// A paged byte cache on the device; the page stride is aligned as Model aligns it.
struct DevicePaged {
  DeviceMem mem;
  std::int64_t pages = 0, page_size = 0, page_stride = 0;
};

struct DeviceLayer {
  LayerType type = LayerType::kSwaOnly;
  DeviceMatrix wq_a, wkv, wq_b, index_wq_b, index_weights_proj;
  DeviceMem wo_a, wo_b;  // bf16 [G, rank, H/G*512], [hidden, G*rank]
  DeviceMem q_norm, kv_norm, sink;
  DeviceCompressor compressor, index_compressor;
  DevicePaged swa, compressed, index_keys;
  DeviceMem state, index_state;  // f32 compressor state caches [blocks, bs, width]
  std::int64_t state_blocks = 0, index_state_blocks = 0;
  std::int64_t extra_width = 0;  // compressed indices per token: K (C4A), C128 width (C128A), 0
};

using model_detail::PagePool;
using model_detail::RequestState;

// Host-known shape of one enqueued step. Graph steps are decode-only, so the
// decode/prefill split is known without reading device values.
struct StepShape {
  std::int64_t requests = 0, tokens = 0, decode_tokens = 0, prefill_tokens = 0;
  std::vector<std::int64_t> verify_rows;  // sampled rows to stage for verification (empty: none)
  bool timed = false;                      // record the phase events
};

}  // namespace smla::cuda_model

namespace smla {

struct CudaModel::Impl {
  ModelConfig config;
  ModelOptions options;
  StepConfig step_config;
  KvFormatInfo format{};
  Device device{DeviceKind::kCuda, 0};
  std::optional<RopeTable> swa_rope, compressed_rope;
  cudaStream_t stream = nullptr;
  // Every op of a step runs in this context: the model's stream and, once
  // size_workspaces() ran, the model's op workspace (so no op allocates).
  std::optional<Context> context;
  CudaStepTiming timing;

  std::vector<cuda_model::DeviceLayer> layers;
  std::vector<cuda_model::RequestState> requests;
  cuda_model::PagePool swa_pool, c4_pool, c128_pool, c4_state_pool, c128_state_pool;
  std::int64_t c4_ring_blocks = 0, c128_ring_blocks = 0;
  // Fixed block-table widths (columns for max_model_len), so every step has the same table shapes.
  std::int64_t swa_cols = 0, c_cols = 0, c4_state_cols = 0, c128_state_cols = 0;
  std::int64_t c128_width = 0;

  // Step inputs at fixed addresses (R = max_requests rows) and their host staging.
  cuda_model::DeviceMem query_lens, seq_lens, swa_table, c4_table, c128_table, c4_state_table, c128_state_table;
  std::vector<std::int32_t> h_query_lens, h_seq_lens, h_swa_table, h_c4_table, h_c128_table, h_c4_state_table,
      h_c128_state_table;

  // Step metadata (T = max_batched_tokens rows) and the per-step state slots.
  cuda_model::DeviceMem query_start_loc, token_to_req, positions, is_valid_token, swa_slot_mapping, swa_indices,
      swa_lens, prefill_gather_lens, c4_slot_mapping, c128_slot_mapping, c128a_decode_indices, c128a_decode_lens,
      c128a_prefill_indices, counts, c4_state_slots, c128_state_slots;

  // Activations (T rows).
  cuda_model::DeviceMem x, x_bf16, layer_out, qr, qr_bf16, kv, q, q_bf16, kv_score, index_q, index_w,
      index_kv_score, q8, head_weights, local_topk, extra_indices, extra_lens, o;
  // Scratch: op workspace (max of the *_workspace_size queries) and cuBLASLt workspace.
  cuda_model::DeviceMem workspace, gemm_workspace;

  // Verification staging per layer: sampled rows of q, indices, lengths and o.
  struct VerifyStage {
    cuda_model::DeviceMem q, swa_indices, swa_lens, extra_indices, extra_lens, o;
  };
  std::vector<VerifyStage> verify_stage;

  // Phase events: [step start, metadata end, then 5 per layer]; see phase_names.
  std::vector<cudaEvent_t> events;
  cudaEvent_t replay_start = nullptr, replay_end = nullptr;

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  int graph_requests = 0;

  ~Impl();

  // views of device memory
  TensorView dev(const cuda_model::DeviceMem& mem, DType dtype, std::initializer_list<std::int64_t> shape,
                 std::int64_t row_offset = 0) const;
  KvCacheView kv_view(const cuda_model::DevicePaged& cache) const;
  IndexerCacheView index_view(const cuda_model::DevicePaged& cache) const;

  // create()
  Status allocate_all();
  Status upload_weights(int layer_index);
  Status size_workspaces();
  Status warm_up();

  // step pieces
  Status validate_batch(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out,
                        std::int64_t* tokens) const;
  Status stage_batch(const std::vector<StepEntry>& batch);  // pages + tables on the host, then upload
  BatchDescription device_batch(std::int64_t requests, std::int64_t tokens) const;
  BatchDescription host_batch(std::int64_t requests) const;
  StepMetadataBuffers device_metadata_buffers(std::int64_t tokens) const;
  Status enqueue_step(const cuda_model::StepShape& shape);
  Status enqueue_metadata(const cuda_model::StepShape& shape);
  Status enqueue_layer(int l, const cuda_model::StepShape& shape);
  Status linear(const cuda_model::DeviceMem& in_bf16, std::int64_t rows, const cuda_model::DeviceMatrix& w,
                const cuda_model::DeviceMem& out) const;
  Status record(std::size_t event_index, const cuda_model::StepShape& shape);
  Status verify_step(const cuda_model::StepShape& shape, StepStats& stats);
  void collect_phase_times(StepStats& stats) const;
  Status check_metadata_errors() const;
};

// "what: <cuda error string>" as an Internal status (Ok on cudaSuccess).
Status cuda_status(cudaError_t error, const char* what);

}  // namespace smla
