// sm90 attention kernel for V32Units rows.
#include "src/cuda/sm90/sm90_variant.cuh"

namespace smla::cuda {

AttentionVariant sm90_attention_variant_v32() { return sm90::make_sm90_variant<sm90::V32Units>(); }

}  // namespace smla::cuda
