// The Context forms of smla/metadata.h: select the context's Op::kStepMetadata
// row and call through its table; and the host rows (reference and cpu share
// the host forms).
#include <array>

#include "src/core/argument_checks.h"
#include "src/core/metadata/metadata_functions.h"
#include "src/core/strided_access.h"
#include "src/runtime/registry_internal.h"

namespace smla {
namespace {

using metadata_detail::MetadataFunctions;

Expected<const MetadataFunctions*> metadata_functions(const Context& context) {
  Problem problem;
  problem.op = Op::kStepMetadata;
  auto entry = runtime::select_entry(context, problem);
  if (!entry) return entry.status();
  return &runtime::functions_of<MetadataFunctions>(**entry);
}

// The host builder, then its counts into `counts` (error word 0).
Status host_build_step_metadata(const Context&, const BatchDescription& batch, const StepConfig& config,
                                const StepMetadataBuffers& out, const TensorView& counts) {
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(counts, "counts", DType::kI64, 1));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(counts, "counts", 0, kStepCountFields));
  auto built = build_step_metadata(batch, config, out);
  if (!built) return built.status();
  const StepCounts& c = *built;
  const std::array<std::int64_t, kStepCountFields> fields = {
      c.num_reqs,          c.num_tokens,       c.num_actual_tokens,    c.num_decodes,
      c.num_prefills,      c.num_decode_tokens, c.num_prefill_tokens,  c.max_query_len,
      c.max_decode_query_len, c.max_prefill_query_len, c.max_seq_len, 0};
  for (std::size_t i = 0; i < fields.size(); ++i) {
    detail::at1<std::int64_t>(counts, static_cast<std::int64_t>(i)) = fields[i];
  }
  return Status::Ok();
}

Status host_c4a_global_topk_indices(const Context&, const TensorView& local_topk, const TensorView& token_to_req,
                                    const TensorView& is_valid_token, const TensorView& block_table,
                                    std::int64_t block_size, const TensorView& global_out,
                                    const TensorView& lens_out) {
  return c4a_global_topk_indices(local_topk, token_to_req, is_valid_token, block_table, block_size, global_out,
                                 lens_out);
}

Status host_v32_request_to_global_indices(const Context&, const TensorView& req_indices, const TensorView& req_id,
                                          const TensorView& block_table, std::int64_t block_size,
                                          std::int64_t block_stride_rows, const TensorView& out,
                                          const TensorView& valid_counts) {
  return v32_request_to_global_indices(req_indices, req_id, block_table, block_size, block_stride_rows, out,
                                       valid_counts);
}

Status host_mixed_sparse_indices(const Context&, const BatchDescription& batch, const StepConfig& config,
                                 int compress_ratio, const TensorView& c4a_local_topk, const TensorView& out_indices,
                                 const TensorView& out_lens) {
  return mixed_sparse_indices(batch, config, compress_ratio, c4a_local_topk, out_indices, out_lens);
}

Status host_dequantize_and_gather(const Context&, const KvCacheView& cache, const TensorView& seq_lens,
                                  const TensorView& gather_lens, const TensorView& block_table, std::int64_t offset,
                                  const TensorView& out) {
  return dequantize_and_gather(cache, seq_lens, gather_lens, block_table, offset, out);
}

Status host_combine_topk_swa_indices(const Context&, const BatchDescription& batch, const StepConfig& config,
                                     int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                                     std::int64_t workspace_rows, const TensorView& topk,
                                     const TensorView& out_indices, const TensorView& out_lens) {
  return combine_topk_swa_indices(batch, config, compress_ratio, chunk, compressed_rows, workspace_rows, topk,
                                  out_indices, out_lens);
}

Status host_gather_prefill_chunk(const Context&, const BatchDescription& batch, const StepConfig& config,
                                 int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                                 const KvCacheView& swa_cache, const KvCacheView& compressed_cache,
                                 const TensorView& out) {
  return gather_prefill_chunk(batch, config, compress_ratio, chunk, compressed_rows, swa_cache, compressed_cache, out);
}

constexpr MetadataFunctions kHostFunctions{
    &host_build_step_metadata,     &host_c4a_global_topk_indices, &host_v32_request_to_global_indices,
    &host_mixed_sparse_indices,    &host_dequantize_and_gather,   &host_combine_topk_swa_indices,
    &host_gather_prefill_chunk};

// Selects the context's row and calls one member of its table, naming the entry in every error.
template <class Member, class... Args>
Status call(const Context& context, const char* name, Member member, const Args&... args) {
  auto functions = metadata_functions(context);
  if (!functions) return functions.status().with_context(std::string(name) + ": ");
  return ((*functions)->*member)(context, args...);
}

}  // namespace

Status build_step_metadata(const Context& context, const BatchDescription& batch, const StepConfig& config,
                           const StepMetadataBuffers& out, const TensorView& counts) {
  return call(context, "build_step_metadata", &MetadataFunctions::build_step_metadata, batch, config, out, counts);
}

Status c4a_global_topk_indices(const Context& context, const TensorView& local_topk, const TensorView& token_to_req,
                               const TensorView& is_valid_token, const TensorView& block_table, std::int64_t block_size,
                               const TensorView& global_out, const TensorView& lens_out) {
  return call(context, "c4a_global_topk_indices", &MetadataFunctions::c4a_global_topk_indices, local_topk,
              token_to_req, is_valid_token, block_table, block_size, global_out, lens_out);
}

Status v32_request_to_global_indices(const Context& context, const TensorView& req_indices, const TensorView& req_id,
                                     const TensorView& block_table, std::int64_t block_size,
                                     std::int64_t block_stride_rows, const TensorView& out,
                                     const TensorView& valid_counts) {
  return call(context, "v32_request_to_global_indices", &MetadataFunctions::v32_request_to_global_indices,
              req_indices, req_id, block_table, block_size, block_stride_rows, out, valid_counts);
}

Status mixed_sparse_indices(const Context& context, const BatchDescription& batch, const StepConfig& config,
                            int compress_ratio, const TensorView& c4a_local_topk, const TensorView& out_indices,
                            const TensorView& out_lens) {
  return call(context, "mixed_sparse_indices", &MetadataFunctions::mixed_sparse_indices, batch, config,
              compress_ratio, c4a_local_topk, out_indices, out_lens);
}

Status dequantize_and_gather(const Context& context, const KvCacheView& cache, const TensorView& seq_lens,
                             const TensorView& gather_lens, const TensorView& block_table, std::int64_t offset,
                             const TensorView& out) {
  return call(context, "dequantize_and_gather", &MetadataFunctions::dequantize_and_gather, cache, seq_lens,
              gather_lens, block_table, offset, out);
}

Status combine_topk_swa_indices(const Context& context, const BatchDescription& batch, const StepConfig& config,
                                int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                                std::int64_t workspace_rows, const TensorView& topk, const TensorView& out_indices,
                                const TensorView& out_lens) {
  return call(context, "combine_topk_swa_indices", &MetadataFunctions::combine_topk_swa_indices, batch, config,
              compress_ratio, chunk, compressed_rows, workspace_rows, topk, out_indices, out_lens);
}

Status gather_prefill_chunk(const Context& context, const BatchDescription& batch, const StepConfig& config,
                            int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                            const KvCacheView& swa_cache, const KvCacheView& compressed_cache, const TensorView& out) {
  return call(context, "gather_prefill_chunk", &MetadataFunctions::gather_prefill_chunk, batch, config,
              compress_ratio, chunk, compressed_rows, swa_cache, compressed_cache, out);
}

namespace runtime {

void add_metadata_entries(std::vector<Entry>& rows) {
  constexpr std::string_view kSummary = "host builder and index transforms (validates every value)";
  rows.push_back(Entry{Implementation{Op::kStepMetadata, "reference", Backend::kReference, 0, {}, kSummary}, nullptr,
                       &kHostFunctions});
  rows.push_back(
      Entry{Implementation{Op::kStepMetadata, "cpu", Backend::kCpu, 0, {}, kSummary}, nullptr, &kHostFunctions});
}

#if defined(SMLA_HAS_CUDA)
void add_cuda_metadata_entries(std::vector<Entry>& rows) {
  Capabilities caps;
  caps.min_compute_capability = 80;
  rows.push_back(Entry{Implementation{Op::kStepMetadata, "cuda", Backend::kCuda, 0, caps,
                                      "device builder and transforms: capacity rows, values masked, graph-safe"},
                       nullptr, &metadata_cuda::kFunctions});
}
#endif

}  // namespace runtime
}  // namespace smla
