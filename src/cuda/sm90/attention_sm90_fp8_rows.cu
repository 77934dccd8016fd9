// sm90 attention kernel for Fp8RowUnits rows.
#include "src/cuda/sm90/sm90_variant.cuh"

namespace smla::cuda {

AttentionVariant sm90_attention_variant_fp8_rows() { return sm90::make_sm90_variant<sm90::Fp8RowUnits>(); }

}  // namespace smla::cuda
