// Internal: the Hopper (sm_90a, wgmma) attention kernel's variants, used for
// 64-head tiles on compute capability 9.0 devices when the build includes
// sm_90a code. SMLA_CUDA_ATTENTION=portable in the environment turns it off
// (A/B comparisons against the portable kernel).
#pragma once

#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {

// sm90_attention_usable() and sm90_attention_variant(kind) are declared in
// sparse_attention_launch.h, where the portable variants are chosen.
AttentionVariant sm90_attention_variant_v4();
AttentionVariant sm90_attention_variant_v32();
AttentionVariant sm90_attention_variant_bf16_512();
AttentionVariant sm90_attention_variant_bf16_576();
AttentionVariant sm90_attention_variant_fp8_rows();

}  // namespace smla::cuda
