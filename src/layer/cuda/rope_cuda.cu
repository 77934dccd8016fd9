// Placeholder until the CUDA implementation lands (issue 6).
#include "smla/cuda_layer.h"

namespace smla {

Status cuda_apply_rope(const RopeArgs&, void*) { return unimplemented("cuda_apply_rope: not implemented yet"); }

}  // namespace smla
