// sm90 attention kernel for V4Units rows.
#include "src/cuda/sm90/sm90_variant.cuh"

namespace smla::cuda {

AttentionVariant sm90_attention_variant_v4() { return sm90::make_sm90_variant<sm90::V4Units>(); }

}  // namespace smla::cuda
