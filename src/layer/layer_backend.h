// Internal: the table of layer ops a backend implements. Public entries
// validate once (src/layer/*.cc) and call through this table, so an
// implementation receives checked arguments and the derived shape. The CPU
// SIMD and CUDA work add entries here (nullptr = Unimplemented).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "smla/backend.h"
#include "smla/compressor.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/rope.h"
#include "smla/status.h"

namespace smla::layer_detail {

struct RopeShape {
  std::int64_t tokens = 0;
  std::int64_t heads = 0;  // 1 for a rank-2 x
  std::int64_t stride_token = 0, stride_head = 0;
};
struct QueryShape {
  std::int64_t tokens = 0, heads = 0, padded_heads = 0;
};
struct KvShape {
  std::int64_t tokens = 0, inserted = 0;  // inserted = slot_mapping rows
};
struct CompressorShape {
  std::int64_t tokens = 0;
  int ratio = 0, coff = 0, head_dim = 0, state_width = 0;
  std::int64_t state_block_size = 0;
};
struct IndexerQueryShape {
  std::int64_t tokens = 0, heads = 0;
};
struct IndexerTopkShape {
  std::int64_t tokens = 0, heads = 0, top_k = 0;
  bool short_context = false;
};
struct OutputShape {
  std::int64_t tokens = 0, heads = 0, groups = 0, rank = 0, hidden = 0;
};

// The output projection's shape, dtype and device checks (no value is read):
// tensors on `device`, wo_a of one of `weight_dtypes`, wo_b of wo_a's dtype.
Expected<OutputShape> validate_output_projection_shapes(const OutputProjectionArgs& args, DeviceKind device,
                                                        std::initializer_list<DType> weight_dtypes);

struct LayerOps {
  Backend backend;
  // Any entry may be nullptr: that op is then Unimplemented on this backend.
  Status (*apply_rope)(const RopeArgs&, const RopeShape&) = nullptr;
  Status (*prepare_query)(const QueryPrepArgs&, const QueryShape&) = nullptr;
  Status (*prepare_kv)(const KvPrepArgs&, const KvShape&) = nullptr;
  Status (*run_compressor)(const CompressorArgs&, const CompressorShape&) = nullptr;
  Status (*prepare_indexer_query)(const IndexerQueryArgs&, const IndexerQueryShape&) = nullptr;
  Status (*indexer_topk)(const IndexerTopkArgs&, const IndexerTopkShape&) = nullptr;
  Status (*project_output)(const OutputProjectionArgs&, const OutputShape&) = nullptr;
};

// The table of a backend (kAuto resolved); nullptr when the backend has none.
const LayerOps* layer_ops(Backend backend);

// Unimplemented naming the op and the backend.
Status layer_op_unimplemented(Backend backend, const char* op_name);

// Calls the backend's entry for an op with validated args and shape, or
// returns Unimplemented naming the op and the backend.
template <class Args, class Shape>
Status call_layer_op(Backend backend, Status (*LayerOps::*member)(const Args&, const Shape&), const char* op_name,
                     const Args& args, const Shape& shape) {
  const LayerOps* ops = layer_ops(backend);
  if (ops == nullptr || ops->*member == nullptr) return layer_op_unimplemented(backend, op_name);
  return (ops->*member)(args, shape);
}

// Implementations (f32 = kCpu, f64 = kReference).
Status apply_rope_f32(const RopeArgs&, const RopeShape&);
Status apply_rope_f64(const RopeArgs&, const RopeShape&);
Status prepare_query_f32(const QueryPrepArgs&, const QueryShape&);
Status prepare_query_f64(const QueryPrepArgs&, const QueryShape&);
Status prepare_kv_f32(const KvPrepArgs&, const KvShape&);
Status prepare_kv_f64(const KvPrepArgs&, const KvShape&);
Status run_compressor_f32(const CompressorArgs&, const CompressorShape&);
Status run_compressor_f64(const CompressorArgs&, const CompressorShape&);
Status prepare_indexer_query_f32(const IndexerQueryArgs&, const IndexerQueryShape&);
Status prepare_indexer_query_f64(const IndexerQueryArgs&, const IndexerQueryShape&);
Status indexer_topk_f32(const IndexerTopkArgs&, const IndexerTopkShape&);
Status indexer_topk_f64(const IndexerTopkArgs&, const IndexerTopkShape&);
Status project_output_f32(const OutputProjectionArgs&, const OutputShape&);
Status project_output_f64(const OutputProjectionArgs&, const OutputShape&);

}  // namespace smla::layer_detail
