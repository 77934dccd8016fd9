// The indexer logit pass compiled once per SIMD target (Highway foreach_target),
// chosen at run time by dynamic dispatch like src/cpu/attention_kernel.cc.
//
// Vectorized over key entries (key blocks stored dimension-major), register-blocked
// 4 heads x 2 vectors: per dimension 4 broadcasts of q and 2 key loads feed 8
// FMA chains (measured faster than 2 x 4 and 6 x 2 on AVX2).
#include <cstddef>
#include <cstdint>

#include "smla/indexer.h"
#include "src/cpu/layer/indexer_score.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/layer/indexer_score.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace smla::layer_detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kDim = smla::kIndexerHeadDim;
constexpr int kVectors = 2;
constexpr int kHeadBlock = 4;

template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF Relu(DF df, VF v) {
  const VF zero = hn::Zero(df);
  return hn::IfThenElse(hn::Gt(v, zero), v, zero);  // NaN fails the compare: 0
}

// Adds the heads [h, h + kHeads) to the logit vectors of one column group.
template <int kHeads, class DF, class VF = hn::Vec<DF>>
HWY_INLINE void AddHeads(DF df, const float* HWY_RESTRICT query, const float* HWY_RESTRICT head_weights,
                         std::int64_t h, const float* HWY_RESTRICT keys, VF* logit) {
  const std::size_t n = hn::Lanes(df);
  VF acc[kHeads][kVectors];
  for (int a = 0; a < kHeads; ++a) {
    for (int v = 0; v < kVectors; ++v) acc[a][v] = hn::Zero(df);
  }
  for (int i = 0; i < kDim; ++i) {
    const float* row = keys + static_cast<std::int64_t>(i) * kIndexerEntryBlock;
    VF k[kVectors];
    for (int v = 0; v < kVectors; ++v) k[v] = hn::LoadU(df, row + v * n);
    for (int a = 0; a < kHeads; ++a) {
      const VF q = hn::Set(df, query[(h + a) * kDim + i]);
      for (int v = 0; v < kVectors; ++v) acc[a][v] = hn::MulAdd(q, k[v], acc[a][v]);
    }
  }
  // Heads are added to the logits in increasing order.
  for (int a = 0; a < kHeads; ++a) {
    const VF w = hn::Set(df, head_weights[h + a]);
    for (int v = 0; v < kVectors; ++v) logit[v] = hn::MulAdd(w, Relu(df, acc[a][v]), logit[v]);
  }
}

void WeightedReluLogits(const float* HWY_RESTRICT query, const float* HWY_RESTRICT head_weights, std::int64_t heads,
                        const float* HWY_RESTRICT key_blocks, std::int64_t entries, float* HWY_RESTRICT logits) {
  const hn::ScalableTag<float> df;
  using VF = hn::Vec<decltype(df)>;
  const std::int64_t n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t group = n * kVectors;
  // group (at most 16 lanes x kVectors on the fixed-width targets built here) divides
  // kIndexerEntryBlock, so a group never straddles two key blocks.
  for (std::int64_t j = 0; j < entries; j += group) {
    VF logit[kVectors];
    for (int v = 0; v < kVectors; ++v) logit[v] = hn::Zero(df);
    std::int64_t h = 0;
    const float* keys = key_blocks + indexer_key_offset(j, 0);
    for (; h + kHeadBlock <= heads; h += kHeadBlock) AddHeads<kHeadBlock>(df, query, head_weights, h, keys, logit);
    for (; h < heads; ++h) AddHeads<1>(df, query, head_weights, h, keys, logit);
    for (int v = 0; v < kVectors; ++v) hn::StoreU(logit[v], df, logits + j + v * n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace smla::layer_detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace smla::layer_detail {

HWY_EXPORT(WeightedReluLogits);

void indexer_weighted_relu_logits(const float* query, const float* head_weights, std::int64_t heads,
                                  const float* key_blocks, std::int64_t entries, float* logits) {
  HWY_DYNAMIC_DISPATCH(WeightedReluLogits)(query, head_weights, heads, key_blocks, entries, logits);
}

}  // namespace smla::layer_detail
#endif  // HWY_ONCE
