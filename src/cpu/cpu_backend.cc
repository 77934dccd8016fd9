// CPU backend registration: multithreaded Highway SIMD kernels, selected by
// default when no GPU is present (resolve_backend).
#include "src/core/backend_ops.h"
#include "src/cpu/cpu_attention.h"

namespace smla::detail {

const BackendOps* cpu_backend_ops() {
  static const BackendOps ops{Backend::kCpu, &cpu::sparse_decode, &cpu::sparse_prefill};
  return &ops;
}

}  // namespace smla::detail
