// Attention kernel variants for the V4Fp8Loader row loader.
#include "src/cuda/sparse_attention_variant.cuh"

namespace smla::cuda {

AttentionVariant attention_variant_v4(int rows) { return make_variant_for_rows<V4Fp8Loader>(rows); }

}  // namespace smla::cuda
