// The cuda rows of the layer ops (smla/registry.h): one per op, sm80 and newer.
// Declared limits are the real ones: the 512-dim heads (q/kv prep, compressor
// attention cache, output projection), the 128-dim indexer heads, and the
// 512-dim cache formats the encoders write. Grid limits (2^31-1 tokens, 65535
// head groups) are far above any model and stay checks of the implementations.
#include "smla/kv_format.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla::runtime {
namespace {

using namespace layer_detail;

constexpr LayerFunctions<RopeArgs, RopeShape> kRope{nullptr, &layer_cuda::apply_rope};
constexpr LayerFunctions<QueryPrepArgs, QueryShape> kQuery{nullptr, &layer_cuda::prepare_query};
constexpr LayerFunctions<KvPrepArgs, KvShape> kKv{nullptr, &layer_cuda::prepare_kv};
constexpr LayerFunctions<CompressorArgs, CompressorShape> kCompressor{nullptr, &layer_cuda::run_compressor};
constexpr LayerFunctions<IndexerQueryArgs, IndexerQueryShape> kIndexerQuery{nullptr,
                                                                             &layer_cuda::prepare_indexer_query};
constexpr LayerFunctions<IndexerTopkArgs, IndexerTopkShape> kIndexerTopk{&layer_cuda::indexer_topk_workspace_size,
                                                                          &layer_cuda::indexer_topk};
constexpr LayerFunctions<OutputProjectionArgs, OutputShape> kProjectOutput{&layer_cuda::project_output_workspace_size,
                                                                            &layer_cuda::project_output};

Capabilities sm80(std::vector<KvFormat> formats, std::vector<int> d_qk, std::vector<int> d_v) {
  Capabilities caps;
  caps.formats = std::move(formats);
  caps.d_qk = std::move(d_qk);
  caps.d_v = std::move(d_v);
  caps.min_compute_capability = 80;
  return caps;
}

}  // namespace

void add_cuda_layer_entries(std::vector<Entry>& rows) {
  const std::vector<KvFormat> rows_512 = row_512_formats();
  auto add = [&](Op op, Capabilities caps, std::string_view summary, const void* functions) {
    rows.push_back(Entry{Implementation{op, "cuda", Backend::kCuda, 0, std::move(caps), summary}, nullptr, functions});
  };
  add(Op::kApplyRope, sm80({}, {}, {}), "warp per (token, 4 heads), angles in double, f32 rotation", &kRope);
  add(Op::kPrepareQuery, sm80({}, {512}, {}), "warp per (token, head): RMSNorm, RoPE, bf16", &kQuery);
  add(Op::kPrepareKv, sm80(rows_512, {512}, {}), "warp per token: RoPE, bf16, encode and insert", &kKv);
  add(Op::kRunCompressor, sm80(rows_512, {512, 128}, {}),
      "state save, then one block per emission: softmax pool, RMSNorm, RoPE, encode", &kCompressor);
  add(Op::kPrepareIndexerQuery, sm80({}, {128}, {}), "warp per (token, head): RoPE, bf16, FP8 with a pow2 scale",
      &kIndexerQuery);
  add(Op::kIndexerTopk, sm80({}, {128}, {}), "logits on CUDA cores into scratch, radix select per token",
      &kIndexerTopk);
  add(Op::kProjectOutput, sm80({}, {}, {512}), "inverse RoPE copy, two cuBLASLt GEMMs (f32 or bf16 weights)",
      &kProjectOutput);
}

}  // namespace smla::runtime
