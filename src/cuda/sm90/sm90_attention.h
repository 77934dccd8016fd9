// Internal: the Hopper (sm_90a, wgmma) attention kernel's variants: the
// "cuda.sm90" implementation (src/cuda/cuda_attention.cc), for compute
// capability 9.0 devices when the build includes sm_90a code.
#pragma once

#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {

// sm90_kernels_built() and sm90_attention_variant(kind) are declared in
// sparse_attention_launch.h beside the portable variants.

// The sm90 kernel's variant for row source Rows (an entry of KernelRows): defined
// in sm90_variant.cuh, instantiated in the generated attention_sm90_<Rows>.cu.
template <class Rows>
AttentionVariant sm90_attention_variant_of();

}  // namespace smla::cuda
