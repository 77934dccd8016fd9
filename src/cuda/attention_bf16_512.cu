// Attention kernel variants for the Bf16RowLoader<512> row loader.
#include "src/cuda/sparse_attention_variant.cuh"

namespace smla::cuda {

AttentionVariant attention_variant_bf16_512(int rows) { return make_variant_for_rows<Bf16RowLoader<512>>(rows); }

}  // namespace smla::cuda
