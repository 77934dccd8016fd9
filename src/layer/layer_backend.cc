#include "src/layer/layer_backend.h"

#include <fmt/format.h>

namespace smla::layer_detail {

namespace {

const LayerOps kReferenceOps{Backend::kReference,  apply_rope_f64,   prepare_query_f64,
                             prepare_kv_f64,       run_compressor_f64, prepare_indexer_query_f64,
                             indexer_topk_f64,     project_output_f64};
const LayerOps kCpuOps{Backend::kCpu,        apply_rope_f32,   prepare_query_f32,
                       prepare_kv_f32,       run_compressor_f32, prepare_indexer_query_f32,
                       indexer_topk_f32,     project_output_f32};

}  // namespace

const LayerOps* layer_ops(Backend backend) {
  switch (resolve_backend(backend)) {
    case Backend::kReference: return &kReferenceOps;
    case Backend::kCpu: return &kCpuOps;
    case Backend::kCuda:
    case Backend::kAuto: break;
  }
  return nullptr;
}

Status layer_op_unimplemented(Backend backend, const char* op_name) {
  return unimplemented(
      fmt::format("{} is not implemented by backend '{}'", op_name, backend_name(resolve_backend(backend))));
}

}  // namespace smla::layer_detail
