// Attention kernel variants for the V32Fp8Loader row loader.
#include "src/cuda/sparse_attention_variant.cuh"

namespace smla::cuda {

AttentionVariant attention_variant_v32(int rows) { return make_variant_for_rows<V32Fp8Loader>(rows); }

}  // namespace smla::cuda
