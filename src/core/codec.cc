#include "smla/codec.h"

namespace smla {

Status quantize_into_cache(const KvCacheView&, const TensorView&, const TensorView&) {
  return unimplemented("quantize_into_cache");
}
Status gather_from_cache(const KvCacheView&, const TensorView&, const TensorView&) {
  return unimplemented("gather_from_cache");
}

}  // namespace smla
