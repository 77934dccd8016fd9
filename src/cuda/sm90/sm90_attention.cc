#include "src/cuda/sm90/sm90_attention.h"

namespace smla::cuda {

bool sm90_kernels_built() {
#if defined(SMLA_CUDA_SM90A)
  return true;
#else
  return false;  // this build has no sm_90a code
#endif
}

AttentionVariant sm90_attention_variant(LoaderKind kind) {
  switch (kind) {
    case LoaderKind::kV4Fp8: return sm90_attention_variant_v4();
    case LoaderKind::kV32Fp8: return sm90_attention_variant_v32();
    case LoaderKind::kBf16Rows512: return sm90_attention_variant_bf16_512();
    case LoaderKind::kBf16Rows576: return sm90_attention_variant_bf16_576();
    case LoaderKind::kFp8Rows: break;
  }
  return sm90_attention_variant_fp8_rows();
}

}  // namespace smla::cuda
