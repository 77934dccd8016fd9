#include "src/runtime/model/model_weights.h"

#include <cmath>

#include "smla/compressor.h"
#include "smla/layer.h"
#include "smla/numeric.h"

namespace smla::model_detail {

namespace {

// splitmix64: a fast, well-mixed stream, so weights depend only on the seed.
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float symmetric() { return static_cast<float>(static_cast<double>(next() >> 40) * 0x1p-23 - 1.0); }
};

std::vector<float> bf16_values(std::int64_t count, float scale, float offset, SplitMix& rng) {
  std::vector<std::uint16_t> stored(static_cast<std::size_t>(count));
  for (auto& v : stored) v = f32_to_bf16(offset + scale * rng.symmetric());
  std::vector<float> values(stored.size());
  (void)convert_bf16_to_f32(TensorView::contiguous(stored.data(), DType::kBF16, {count}),
                            TensorView::contiguous(values.data(), DType::kF32, {count}));
  return values;
}

Matrix matrix(std::int64_t rows, std::int64_t cols, SplitMix& rng) {
  return Matrix{rows, cols, bf16_values(rows * cols, 1.0f / std::sqrt(static_cast<float>(cols)), 0.0f, rng)};
}

CompressorWeights compressor(int ratio, int head_dim, int hidden, SplitMix& rng) {
  const int coff = compressor_coff(ratio);
  CompressorWeights w;
  w.wkv_wgate = matrix(2 * coff * head_dim, hidden, rng);
  w.ape = bf16_values(static_cast<std::int64_t>(ratio) * coff * head_dim, 0.5f, 0.0f, rng);
  w.norm = bf16_values(head_dim, 0.25f, 1.0f, rng);
  return w;
}

}  // namespace

LayerWeights make_layer_weights(const ModelConfig& c, int layer, std::uint64_t seed) {
  SplitMix rng{seed * 0x2545F4914F6CDD1Dull + static_cast<std::uint64_t>(layer) + 1};
  constexpr int kHeadDim = 512;
  LayerWeights w;
  w.ratio = c.compress_ratios[static_cast<std::size_t>(layer)];
  w.wq_a = matrix(c.q_lora_rank, c.hidden, rng);
  w.wkv = matrix(kHeadDim, c.hidden, rng);
  w.wq_b = matrix(static_cast<std::int64_t>(c.num_heads) * kHeadDim, c.q_lora_rank, rng);
  w.q_norm = bf16_values(c.q_lora_rank, 0.25f, 1.0f, rng);
  w.kv_norm = bf16_values(kHeadDim, 0.25f, 1.0f, rng);
  w.sink = bf16_values(c.num_heads, 1.0f, 0.0f, rng);
  if (w.ratio > 1) w.compressor = compressor(w.ratio, kHeadDim, c.hidden, rng);
  if (w.ratio == 4) {
    w.index_wq_b = matrix(static_cast<std::int64_t>(c.index_heads) * 128, c.q_lora_rank, rng);
    w.index_weights_proj = matrix(c.index_heads, c.hidden, rng);
    w.index_compressor = compressor(4, 128, c.hidden, rng);
  }
  const std::int64_t group_width = static_cast<std::int64_t>(c.num_heads) / c.o_groups * kHeadDim;
  w.wo_a = bf16_values(c.o_groups * static_cast<std::int64_t>(c.o_lora_rank) * group_width,
                       1.0f / std::sqrt(static_cast<float>(group_width)), 0.0f, rng);
  w.wo_b = matrix(c.hidden, static_cast<std::int64_t>(c.o_groups) * c.o_lora_rank, rng);
  return w;
}

}  // namespace smla::model_detail
