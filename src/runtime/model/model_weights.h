// Internal: synthetic per-layer weights of smla::Model.
#pragma once

#include <cstdint>
#include <vector>

#include "smla/model.h"

namespace smla::model_detail {

// A row-major f32 matrix [rows, cols] (converted from bf16 at load).
struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> values;
};

struct CompressorWeights {
  Matrix wkv_wgate;                // [2*coff*d, hidden]
  std::vector<float> ape;          // [r, coff*d]
  std::vector<float> norm;         // [d]
};

struct LayerWeights {
  int ratio = 1;
  Matrix wq_a, wkv, wq_b;          // [q_lora, hidden], [512, hidden], [H*512, q_lora]
  std::vector<float> q_norm, kv_norm, sink;
  CompressorWeights compressor;    // ratio > 1
  Matrix index_wq_b, index_weights_proj;  // ratio 4: [Hi*128, q_lora], [Hi, hidden]
  CompressorWeights index_compressor;     // ratio 4, d = 128
  std::vector<float> wo_a;         // [G, o_lora, H/G*512]
  Matrix wo_b;                     // [hidden, G*o_lora]
};

// Seeded synthetic weights: values uniform in +-1/sqrt(fan_in), rounded to
// bf16 (the storage type) and converted to f32 once.
LayerWeights make_layer_weights(const ModelConfig& config, int layer, std::uint64_t seed);

}  // namespace smla::model_detail
