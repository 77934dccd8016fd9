// Attention kernel variants for the Fp8RowLoader row loader.
#include "src/cuda/sparse_attention_variant.cuh"

namespace smla::cuda {

AttentionVariant attention_variant_fp8_rows(int rows) { return make_variant_for_rows<Fp8RowLoader>(rows); }

}  // namespace smla::cuda
