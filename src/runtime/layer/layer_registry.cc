// The host rows of the layer ops (smla/registry.h): "reference" (float64
// loops) and "cpu" (float32, OpenBLAS for the GEMMs) for every op. Neither
// takes scratch, and both run any head count, format and shape the front end
// accepts, so their capabilities are "anything".
#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {
namespace {

// A host implementation as a registry function: no context, no scratch.
template <class Args, class Shape, Status (*Implementation)(const Args&, const Shape&)>
Status run_host(const Context&, const Args& args, const Shape& shape, void*) {
  return Implementation(args, shape);
}

template <class Args, class Shape, Status (*Implementation)(const Args&, const Shape&)>
constexpr LayerFunctions<Args, Shape> kHost{nullptr, &run_host<Args, Shape, Implementation>};

struct HostRow {
  Op op;
  const void* reference;
  const void* cpu;
};

const HostRow kRows[] = {
    {Op::kApplyRope, &kHost<RopeArgs, RopeShape, apply_rope_f64>, &kHost<RopeArgs, RopeShape, apply_rope_f32>},
    {Op::kPrepareQuery, &kHost<QueryPrepArgs, QueryShape, prepare_query_f64>,
     &kHost<QueryPrepArgs, QueryShape, prepare_query_f32>},
    {Op::kPrepareKv, &kHost<KvPrepArgs, KvShape, prepare_kv_f64>, &kHost<KvPrepArgs, KvShape, prepare_kv_f32>},
    {Op::kRunCompressor, &kHost<CompressorArgs, CompressorShape, run_compressor_f64>,
     &kHost<CompressorArgs, CompressorShape, run_compressor_f32>},
    {Op::kPrepareIndexerQuery, &kHost<IndexerQueryArgs, IndexerQueryShape, prepare_indexer_query_f64>,
     &kHost<IndexerQueryArgs, IndexerQueryShape, prepare_indexer_query_f32>},
    {Op::kIndexerTopk, &kHost<IndexerTopkArgs, IndexerTopkShape, indexer_topk_f64>,
     &kHost<IndexerTopkArgs, IndexerTopkShape, indexer_topk_f32>},
    {Op::kProjectOutput, &kHost<OutputProjectionArgs, OutputShape, project_output_f64>,
     &kHost<OutputProjectionArgs, OutputShape, project_output_f32>},
};

}  // namespace
}  // namespace smla::layer_detail

namespace smla::runtime {

void add_layer_entries(std::vector<Entry>& rows) {
  for (const layer_detail::HostRow& row : layer_detail::kRows) {
    rows.push_back(Entry{Implementation{row.op, "reference", Backend::kReference, 0, {},
                                        "float64 plain loops, angles recomputed in double (the oracle)"},
                         nullptr, row.reference});
    rows.push_back(Entry{Implementation{row.op, "cpu", Backend::kCpu, 0, {},
                                        "float32, threads; OpenBLAS sgemm for the indexer logits and the projection"},
                         nullptr, row.cpu});
  }
}

}  // namespace smla::runtime
