// File: model.h
//
// A DeepSeek-V4-shaped attention stack that ties the step metadata
// (smla/metadata.h), the layer ops (smla/layer.h) and the sparse attention
// (smla/attention.h) into one step for a batch, on any backend: the model runs
// in the Context it is created from, and its weights, caches and activations
// live in that backend's memory (host memory for reference / cpu, the current
// CUDA device for cuda).
//
// Per step: the batch (lengths, block tables, compressor-state tables) is
// staged, the step metadata is built (build_step_metadata in the context), then
// per layer (spec 5.8): projections (host: OpenBLAS f32; cuda: cuBLASLt, bf16
// weights and activations, f32 accumulation) -> q/kv RMSNorm -> query prep +
// SWA insert -> compressor(s) -> indexer query + top-k (C4A) -> index
// transforms -> sparse_decode over the paged caches (every token a row) ->
// inverse-RoPE grouped output projection -> RMSNorm(x + attention output), a
// stand-in for the MoE/mHC block, which is out of scope. Weights are synthetic
// (seeded) bf16 values.
//
// Every buffer and workspace is sized in create() for
// ModelOptions::max_batched_tokens / max_requests / max_model_len; a step
// allocates nothing. Page ids depend only on the calls, so two models of any
// backends fed the same calls hold the same page ids.
//
// Whole-step CUDA graph (cuda contexts): capture_decode_graph(R) records one
// decode step (metadata + all layers) for R requests of
// 1 + num_speculative_tokens tokens, reading only inputs at fixed addresses;
// replay_decode_graph() allocates pages, stages lengths, tables and x, launches
// the graph and returns the output. Replays equal eager step()s of the same
// batch bit for bit. Host contexts return Unimplemented.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/metadata.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

struct ModelConfig {
  std::string name;
  int hidden = 4096;
  int num_heads = 64;
  int q_lora_rank = 1024;
  int o_lora_rank = 1024;
  int o_groups = 8;
  int window = 128;
  int index_topk = 512;
  int index_heads = 64;
  float rms_eps = 1e-6f;
  std::vector<int> compress_ratios;  // per layer: 1 (SWA-only), 4 (C4A) or 128 (C128A)

  // "v4-flash", "v4-pro" or "tiny" with `layers` layers: layer 0 SWA-only, then
  // C4A and C128A alternating, so 3 layers cover every type.
  static Expected<ModelConfig> preset(std::string_view name, int layers);
};

struct ModelOptions {
  KvFormat kv_format = KvFormat::kV4Fp8;
  int max_requests = 8;
  std::int64_t max_model_len = 4096;
  std::int64_t max_batched_tokens = 1024;
  int num_speculative_tokens = 1;  // MTP: decode rows carry 1 + this tokens
  std::uint64_t seed = 1;
  // Attention rows per layer and step re-run on the float64 reference when a
  // step verifies (all rows when the step has no more; else evenly spaced,
  // first and last included).
  int verify_rows = 16;
  // Projections one token at a time (sgemv) so results do not depend on how
  // tokens are batched: chunked and whole prefill then leave bit-identical
  // caches. Off by default (OpenBLAS sgemm is much faster).
  bool row_stable = false;
};

// One request's share of a step; steps list decodes first (spec 3.1).
struct StepEntry {
  int request = 0;
  int query_len = 0;
};

struct LayerCheck {
  int layer = 0;
  LayerType type = LayerType::kSwaOnly;
  double max_abs_err = 0.0;  // attention output, backend vs float64 reference
  std::int64_t rows = 0;
};

struct StepStats {
  double projection_s = 0, cache_write_s = 0, indexer_s = 0, attention_s = 0, output_s = 0, verify_s = 0;
  std::vector<LayerCheck> checks;
};

// Time of the last step() or replay_decode_graph() (cuda: cudaEvents, host:
// wall clock), excluding batch staging, input upload, output download and
// verification.
struct StepTiming {
  double step_s = 0.0;
};

class Model {
 public:
  // The model runs every op in a copy of `context` (cuda: on a stream and
  // with an op workspace of its own, made here).
  static Expected<std::unique_ptr<Model>> create(const Context& context, const ModelConfig& config,
                                                 const ModelOptions& options);
  // In a new Context of `backend` (kAuto: cuda when a device is present).
  static Expected<std::unique_ptr<Model>> create(const ModelConfig& config, const ModelOptions& options,
                                                 Backend backend = Backend::kCpu);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  Backend backend() const;  // of the model's context (resolved)
  // A new empty request; its id stays valid until finish_request.
  Expected<int> add_request();
  // Frees the request's cache pages.
  Status finish_request(int request);
  std::int64_t seq_len(int request) const;  // -1 for an unknown id

  // Appends query_len tokens to each listed request and runs every layer.
  // x, out: HOST [T, hidden] f32 contiguous with T = sum of query_len, rows
  // in batch order; returns once out is written. stats gets the per-phase
  // times (cuda: device times from cudaEvents; step metadata counts with the
  // indexer). verify: after the step, re-run each layer's attention on the
  // float64 reference for a row sample (ModelOptions::verify_rows, staged
  // during the step) and record the max abs error in stats->checks.
  Status step(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out, bool verify,
              StepStats* stats);

  // Captures one decode step for `batch_requests` requests of
  // 1 + num_speculative_tokens tokens each (replaces an earlier graph).
  // Nothing runs and no cache changes during capture. Unimplemented on the
  // host backends.
  Status capture_decode_graph(int batch_requests);
  int decode_graph_requests() const;  // 0 without a captured graph
  // Runs a decode step through the graph: `batch` must list exactly the
  // captured number of requests, each with query_len 1 + num_speculative_tokens.
  Status replay_decode_graph(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out);

  // Time of the last step() or replay_decode_graph().
  const StepTiming& last_timing() const;

  // Attention caches (SWA, compressed, indexer keys) in pages currently held / reserved.
  std::int64_t kv_cache_bytes_used() const;
  std::int64_t kv_cache_bytes_reserved() const;
  // Raw bytes of every cache of a layer, for tests comparing runs: SWA,
  // compressed, indexer keys, compressor state, indexer compressor state.
  std::vector<std::uint8_t> layer_cache_bytes(int layer) const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smla
