// sm90 attention kernel for Bf16RowUnits<576> rows.
#include "src/cuda/sm90/sm90_variant.cuh"

namespace smla::cuda {

AttentionVariant sm90_attention_variant_bf16_576() { return sm90::make_sm90_variant<sm90::Bf16RowUnits<576>>(); }

}  // namespace smla::cuda
