// File: model.h
//
// A DeepSeek-V4-shaped attention stack that ties the step metadata
// (smla/metadata.h), the layer ops (smla/layer.h) and the sparse attention
// (smla/attention.h) into one step for a batch, on any backend.
//
// Per step and layer (spec 5.8): projections (OpenBLAS) -> q/kv norms ->
// query prep + SWA insert -> compressor(s) -> indexer top-k (C4A) -> sparse
// attention for every token (sparse_decode over the paged caches) -> inverse-
// RoPE grouped output projection. Between layers the hidden state becomes
// RMSNorm(x + attention output): a stand-in for the MoE/mHC block, which is out
// of scope. Weights are synthetic (seeded), stored bf16 and converted to f32
// once at creation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "smla/backend.h"
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

class Model {
 public:
  static Expected<std::unique_ptr<Model>> create(const ModelConfig& config, const ModelOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  // A new empty request; its id stays valid until finish_request.
  Expected<int> add_request();
  // Frees the request's cache pages.
  Status finish_request(int request);
  std::int64_t seq_len(int request) const;  // -1 for an unknown id

  // Appends query_len tokens to each listed request and runs every layer.
  // x, out: [T, hidden] f32 with T = sum of query_len, rows in batch order.
  // verify: re-run each layer's attention on the float64 reference for a row
  // sample (ModelOptions::verify_rows) and record the max abs error.
  Status step(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out, Backend backend,
              bool verify, StepStats* stats);

  // Attention caches (SWA, compressed, indexer keys) in pages currently held / reserved.
  std::int64_t kv_cache_bytes_used() const;
  std::int64_t kv_cache_bytes_reserved() const;
  // Raw bytes of every cache of a layer (attention, indexer and compressor
  // state), for tests comparing runs.
  std::vector<std::uint8_t> layer_cache_bytes(int layer) const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smla
