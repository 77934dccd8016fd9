// Placeholder until the CUDA implementation lands (issue 6).
#include "smla/cuda_layer.h"

namespace smla {

Status cuda_run_compressor(const CompressorArgs&, void*) { return unimplemented("cuda_run_compressor: not implemented yet"); }

}  // namespace smla
