// File: cuda_model.h
//
// The GPU twin of smla::Model (smla/model.h): the same configuration, seeded
// weights, page allocation and per-layer step, with every weight, cache and
// activation on the current CUDA device.
//
// Per step: the batch (lengths, block tables, compressor-state tables) is
// uploaded, the step metadata is built on the device (build_step_metadata in a
// cuda Context),
// then each layer runs projections (cuBLASLt, bf16 weights and activations,
// f32 accumulation and outputs) -> q/kv RMSNorm -> query prep + SWA insert ->
// compressor(s) -> indexer query + top-k (C4A) -> index transforms ->
// sparse_decode over the paged caches (every token a row) -> inverse-RoPE
// grouped output projection -> RMSNorm(x + attention output). Pages are
// allocated on the host exactly as Model allocates them, so two models fed the
// same calls hold the same page ids.
//
// Every device buffer and workspace is sized in create() for
// ModelOptions::max_batched_tokens / max_requests / max_model_len; a step
// allocates nothing on the device. One CUDA stream per model, and one Context
// (smla/context.h) on it that owns the op workspace, made at create(); every
// op of a step runs in it. step() returns after the output is on the host.
//
// Whole-step CUDA graph: capture_decode_graph(R) records one decode step
// (metadata + all layers) for R requests of 1 + num_speculative_tokens tokens
// each, reading only device inputs at fixed addresses; replay_decode_graph()
// allocates pages on the host, uploads lengths, block tables and x, launches
// the graph and downloads the output. Its results equal an eager step() of the
// same batch bit for bit (same kernels, same order, same shapes).
//
// Without the CUDA backend (or without a device) create() returns
// Unimplemented.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "smla/model.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// Device time of the last step or replay (cudaEvent), excluding host-side
// batch preparation, input upload, output download and verification.
struct CudaStepTiming {
  double step_s = 0.0;
};

class CudaModel {
 public:
  static Expected<std::unique_ptr<CudaModel>> create(const ModelConfig& config, const ModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const;
  Expected<int> add_request();
  Status finish_request(int request);
  std::int64_t seq_len(int request) const;  // -1 for an unknown id

  // As Model::step: x, out are HOST [T, hidden] f32 contiguous. stats gets
  // the per-phase device times (cudaEvent) of every layer; with verify, each
  // layer's attention is re-run on the float64 host reference for a row
  // sample (ModelOptions::verify_rows) after the step, and stats->checks
  // records the max abs error.
  Status step(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out, bool verify,
              StepStats* stats);

  // Captures one decode step for `batch_requests` requests of
  // 1 + num_speculative_tokens tokens each (replaces an earlier graph).
  // Nothing runs and no cache changes during capture.
  Status capture_decode_graph(int batch_requests);
  int decode_graph_requests() const;  // 0 without a captured graph
  // Runs a decode step through the graph: `batch` must list exactly the
  // captured number of requests, each with query_len 1 + num_speculative_tokens.
  Status replay_decode_graph(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out);

  // Device time of the last step() or replay_decode_graph().
  const CudaStepTiming& last_timing() const;

  std::int64_t kv_cache_bytes_used() const;
  std::int64_t kv_cache_bytes_reserved() const;
  // Device bytes of every cache of a layer, in Model::layer_cache_bytes order
  // (SWA, compressed, indexer keys, compressor state, indexer state).
  std::vector<std::uint8_t> layer_cache_bytes(int layer) const;

 private:
  struct Impl;
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smla
