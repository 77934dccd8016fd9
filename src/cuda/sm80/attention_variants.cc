// The portable kernel's variants by row source: a table over KernelRows whose
// entries are instantiated in the generated attention_<Rows>.cu files.
#include <array>

#include "src/cuda/sparse_attention_launch.h"

namespace smla::cuda {
namespace {

template <class... Rows>
constexpr std::array<AttentionVariant (*)(int), sizeof...(Rows)> portable_variants(KvFormatList<Rows...>) {
  return {&attention_variant_of<Rows>...};
}

}  // namespace

AttentionVariant attention_variant(LoaderKind kind, int rows) {
  static constexpr auto kVariants = portable_variants(KernelRows{});
  return kVariants[static_cast<std::size_t>(kind)](rows);
}

}  // namespace smla::cuda
