// Internal: the Hopper (sm_90a, wgmma) attention kernel's variants: the
// "cuda.sm90" implementation (src/cuda/cuda_attention.cc), for compute
// capability 9.0 devices when the build includes sm_90a code.
#pragma once

#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {

// sm90_kernels_built() and sm90_attention_variant(kind) are declared in
// sparse_attention_launch.h beside the portable variants.
AttentionVariant sm90_attention_variant_v4();
AttentionVariant sm90_attention_variant_v32();
AttentionVariant sm90_attention_variant_bf16_512();
AttentionVariant sm90_attention_variant_bf16_576();
AttentionVariant sm90_attention_variant_fp8_rows();

}  // namespace smla::cuda
