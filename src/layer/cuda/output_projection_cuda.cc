// Placeholder until the CUDA implementation lands (issue 6).
#include "smla/cuda_layer.h"

namespace smla {

Expected<std::size_t> cuda_project_output_workspace_size(const OutputProjectionArgs&) { return unimplemented("cuda_project_output: not implemented yet"); }
Status cuda_project_output(const OutputProjectionArgs&, void*, std::size_t, void*) { return unimplemented("cuda_project_output: not implemented yet"); }

}  // namespace smla
