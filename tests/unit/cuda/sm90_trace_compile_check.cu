// The sm90 kernels with their phase timeline compiled in (SMLA_SM90_TRACE, set for this
// target only; docs/cuda_backend.md, "Phase timeline"): one FP8 row source (the direct
// kernel, paired and not) and the flat bf16 rows (the copying kernel). Compiled, never
// linked: the library's kernels are the untraced ones, and this keeps the tooling building.
#include "src/cuda/sm90/sm90_variant.cuh"

#if !defined(SMLA_SM90_TRACE)
#error "sm90_trace_compile_check needs SMLA_SM90_TRACE (tests/unit/cuda/CMakeLists.txt)"
#endif

template smla::cuda::AttentionVariant smla::cuda::sm90_attention_variant_of<smla::V32Fp8Format>();
template smla::cuda::AttentionVariant smla::cuda::sm90_attention_variant_of<smla::cuda::FlatBf16Rows<576>>();
