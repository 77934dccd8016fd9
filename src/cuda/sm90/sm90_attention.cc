#include "src/cuda/sm90/sm90_attention.h"

#include <array>

namespace smla::cuda {

bool sm90_kernels_built() {
#if defined(SMLA_CUDA_SM90A)
  return true;
#else
  return false;  // this build has no sm_90a code
#endif
}

namespace {

template <class... Rows>
constexpr std::array<AttentionVariant (*)(), sizeof...(Rows)> sm90_variants(KvFormatList<Rows...>) {
  return {&sm90_attention_variant_of<Rows>...};
}

}  // namespace

AttentionVariant sm90_attention_variant(LoaderKind kind) {
  static constexpr auto kVariants = sm90_variants(KernelRows{});
  return kVariants[static_cast<std::size_t>(kind)]();
}

}  // namespace smla::cuda
