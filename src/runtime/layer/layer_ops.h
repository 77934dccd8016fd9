// Internal: the layer ops' front end and the implementations behind their
// registry rows (smla/registry.h).
//
// A public entry validates once for the context's backend (host backends:
// shapes and every value it may follow; cuda: shapes, dtypes and devices only,
// values stay on the device), derives the shape below, builds the Problem,
// selects a row (runtime::select_entry) and calls the row's
// runtime::OpFunctions<Args, Shape> with the validated args, the shape and the
// scratch the row asked for (taken from the context). Implementations receive
// checked arguments; the CUDA ones keep only their device-only checks (grid
// limits, the current device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "smla/compressor.h"
#include "smla/context.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/registry.h"
#include "smla/rope.h"
#include "smla/status.h"
#include "src/core/argument_checks.h"
#include "src/core/strided_access.h"
#include "src/runtime/op_tables.h"
#include "src/runtime/registry_internal.h"

namespace smla::layer_detail {

// The shared argument checks and strided reads, the front ends' vocabulary.
using detail::check_block_table;
using detail::check_device;
using detail::check_index_vector;
using detail::check_positions;
using detail::check_tensor;
using detail::kAnyExtent;
using detail::load_floats;
using detail::read_index;
using detail::read_table;

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
  bool short_context = false;  // host backends: the whole batch takes the short-context fill
  std::int64_t capacity = 0;   // cuda: entries a token may score (block table columns x key page size)
};
struct OutputShape {
  std::int64_t tokens = 0, heads = 0, groups = 0, rank = 0, hidden = 0;
};

// The front end's validation of each op for tensors on `device`.
Expected<RopeShape> validate_rope(const RopeArgs& args, DeviceKind device);
Expected<QueryShape> validate_query(const QueryPrepArgs& args, DeviceKind device);
Expected<KvShape> validate_kv(const KvPrepArgs& args, DeviceKind device);
Expected<CompressorShape> validate_compressor(const CompressorArgs& args, DeviceKind device);
Expected<IndexerQueryShape> validate_indexer_query(const IndexerQueryArgs& args, DeviceKind device);
Expected<IndexerTopkShape> validate_indexer_topk(const IndexerTopkArgs& args, DeviceKind device);
// wo_a of one of `weight_dtypes` (cuda: f32 or bf16; host: f32), wo_b of wo_a's dtype.
Expected<OutputShape> validate_output_projection(const OutputProjectionArgs& args, DeviceKind device);

// A layer op's Problem: its op, rows, heads and head dims (format and keys
// are set by the ops that have them).
inline Problem make_problem(Op op, std::int64_t tokens, std::int64_t heads, int d_qk, int d_v = 0) {
  Problem problem;
  problem.op = op;
  problem.tokens = tokens;
  problem.heads = heads;
  problem.d_qk = d_qk;
  problem.d_v = d_v;
  return problem;
}

// What select() decides on, per op.
Problem layer_problem(const RopeArgs& args, const RopeShape& shape);
Problem layer_problem(const QueryPrepArgs& args, const QueryShape& shape);
Problem layer_problem(const KvPrepArgs& args, const KvShape& shape);
Problem layer_problem(const CompressorArgs& args, const CompressorShape& shape);
Problem layer_problem(const IndexerQueryArgs& args, const IndexerQueryShape& shape);
Problem layer_problem(const IndexerTopkArgs& args, const IndexerTopkShape& shape);
Problem layer_problem(const OutputProjectionArgs& args, const OutputShape& shape);

template <class Args, class Shape>
using LayerFunctions = runtime::OpFunctions<Args, Shape>;

// The selected row's functions for validated args.
template <class Args, class Shape>
Expected<const LayerFunctions<Args, Shape>*> select_layer_functions(const Context& context, const Args& args,
                                                                    const Shape& shape) {
  auto entry = runtime::select_entry(context, layer_problem(args, shape));
  if (!entry) return entry.status();
  return &runtime::functions_of<LayerFunctions<Args, Shape>>(**entry);
}

// Scratch bytes a row takes for validated args (0 when it takes none).
template <class Args, class Shape>
Expected<std::size_t> scratch_bytes(const LayerFunctions<Args, Shape>& functions, const Context& context,
                                    const Args& args, const Shape& shape) {
  if (functions.workspace_size == nullptr) return std::size_t{0};
  return functions.workspace_size(context, args, shape);
}

// select -> scratch -> run, for validated args.
template <class Args, class Shape>
Status run_layer_op(const Context& context, const Args& args, const Shape& shape) {
  auto functions = select_layer_functions(context, args, shape);
  if (!functions) return functions.status();
  auto bytes = scratch_bytes(**functions, context, args, shape);
  if (!bytes) return bytes.status();
  return runtime::run_with_scratch(context, *bytes,
                                   [&](void* scratch) { return (*functions)->run(context, args, shape, scratch); });
}

// Prefixes a failed status with the op's name ("prepare_query: "), formatting
// nothing on success.
inline Status named(Status status, std::string_view op, std::string_view suffix = "") {
  if (status.ok()) return status;
  return status.with_context(std::string(op) + std::string(suffix) + ": ");
}

// The whole front end of one op: validate for the context's device, then
// run_layer_op; every error names the op.
template <class Args, class Shape>
Status layer_entry(const Context& context, std::string_view op, const Args& args,
                   Expected<Shape> (*validate)(const Args&, DeviceKind)) {
  auto shape = validate(args, runtime::tensor_device(context));
  if (!shape) return named(shape.status(), op);
  return named(run_layer_op(context, args, *shape), op);
}

// The workspace query of one op (validation as layer_entry).
template <class Args, class Shape>
Expected<std::size_t> layer_entry_workspace_size(const Context& context, std::string_view op, const Args& args,
                                                 Expected<Shape> (*validate)(const Args&, DeviceKind)) {
  auto shape = validate(args, runtime::tensor_device(context));
  if (!shape) return named(shape.status(), op, "_workspace_size");
  auto functions = select_layer_functions(context, args, *shape);
  if (!functions) return named(functions.status(), op, "_workspace_size");
  auto bytes = scratch_bytes(**functions, context, args, *shape);
  if (!bytes) return named(bytes.status(), op, "_workspace_size");
  return *bytes;
}

// Host implementations (f32 = cpu, f64 = reference): no scratch, no context.
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

namespace smla::layer_cuda {

// CUDA implementations (src/cuda/layer): enqueue on context.stream(); the
// device-only checks (grid limits, the current device) happen here.
using layer_detail::CompressorShape;
using layer_detail::IndexerQueryShape;
using layer_detail::IndexerTopkShape;
using layer_detail::KvShape;
using layer_detail::OutputShape;
using layer_detail::QueryShape;
using layer_detail::RopeShape;

Status apply_rope(const Context& context, const RopeArgs& args, const RopeShape& shape, void* scratch);
Status prepare_query(const Context& context, const QueryPrepArgs& args, const QueryShape& shape, void* scratch);
Status prepare_kv(const Context& context, const KvPrepArgs& args, const KvShape& shape, void* scratch);
Status run_compressor(const Context& context, const CompressorArgs& args, const CompressorShape& shape,
                      void* scratch);
Status prepare_indexer_query(const Context& context, const IndexerQueryArgs& args, const IndexerQueryShape& shape,
                             void* scratch);
Expected<std::size_t> indexer_topk_workspace_size(const Context& context, const IndexerTopkArgs& args,
                                                  const IndexerTopkShape& shape);
Status indexer_topk(const Context& context, const IndexerTopkArgs& args, const IndexerTopkShape& shape,
                    void* scratch);
Expected<std::size_t> project_output_workspace_size(const Context& context, const OutputProjectionArgs& args,
                                                    const OutputShape& shape);
Status project_output(const Context& context, const OutputProjectionArgs& args, const OutputShape& shape,
                      void* scratch);

}  // namespace smla::layer_cuda
