// Prefill chunk plans, workspace sizing and the combined prefill indices
// (spec 3.6, 4.4, 5.5).
#include <fmt/format.h>

#include <algorithm>

#include "smla/metadata.h"
#include "src/core/argument_checks.h"
#include "src/core/metadata/metadata_rules.h"
#include "src/core/strided_access.h"

namespace smla {

using detail::at1;
using detail::row_ptr;

namespace {

struct PrefillRequest {
  std::int64_t seq_len, query_len, compressed, gather;
};

PrefillRequest prefill_request(const BatchDescription& batch, const StepConfig& config, int ratio, std::int64_t r) {
  const std::int64_t s = at1<const std::int32_t>(batch.seq_lens, r);
  const std::int64_t q = at1<const std::int32_t>(batch.query_lens, r);
  return {s, q, ratio > 1 ? s / ratio : 0, detail::prefill_gather_len(s, q, config.window)};
}

// Static bound of the compressed region: cdiv(max_model_len, r), 0 for SWA-only.
std::int64_t static_compressed_rows(const StepConfig& config, int ratio) {
  return ratio > 1 ? detail::cdiv(config.max_model_len, ratio) : 0;
}

// Gather width bound: query_len <= max_num_batched_tokens, prefix part <= W - 1.
std::int64_t static_workspace_rows(const StepConfig& config, int ratio) {
  return static_compressed_rows(config, ratio) + config.window - 1 + config.max_num_batched_tokens;
}

}  // namespace

Expected<std::vector<PrefillChunk>> prefill_chunk_plan(const BatchDescription& batch, const StepConfig& config,
                                                       int compress_ratio, ChunkPolicy policy) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  Expected<StepCounts> counts = describe_step(batch, config);
  if (!counts) return counts.status();
  // Budget of spec 3.6 (vLLM's get_prefill_chunk_plan): W, not W - 1, per request.
  const std::int64_t area_limit = config.prefill_chunk_size * (static_compressed_rows(config, compress_ratio) +
                                                               config.window + config.max_num_batched_tokens);

  std::vector<PrefillChunk> plan;
  std::int64_t token = counts->num_decode_tokens;
  std::int64_t r = counts->num_decodes;
  while (r < counts->num_reqs) {
    PrefillChunk chunk;
    chunk.req_begin = r;
    chunk.token_begin = token;
    PrefillRequest first = prefill_request(batch, config, compress_ratio, r);
    std::int64_t max_compressed = first.compressed;
    std::int64_t max_gather = first.gather;
    token += first.query_len;
    ++r;
    while (r < counts->num_reqs) {
      const PrefillRequest next = prefill_request(batch, config, compress_ratio, r);
      const std::int64_t candidate_compressed = std::max(max_compressed, next.compressed);
      const std::int64_t candidate_gather = std::max(max_gather, next.gather);
      const std::int64_t reqs = r - chunk.req_begin + 1;
      const bool fits = policy == ChunkPolicy::kFixed ? reqs <= config.prefill_chunk_size
                                                      : reqs * (candidate_compressed + candidate_gather) <= area_limit;
      if (!fits) break;
      max_compressed = candidate_compressed;
      max_gather = candidate_gather;
      token += next.query_len;
      ++r;
    }
    chunk.req_end = r;
    chunk.token_end = token;
    chunk.compressed_rows = max_compressed;
    chunk.workspace_rows = max_compressed + max_gather;
    plan.push_back(chunk);
  }
  return plan;
}

Expected<PrefillWorkspaceShape> static_prefill_workspace(const StepConfig& config, int compress_ratio) {
  SMLA_RETURN_IF_ERROR(validate_step_config(config));
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  PrefillWorkspaceShape shape;
  shape.chunk_reqs = config.prefill_chunk_size;
  shape.compressed_rows = static_compressed_rows(config, compress_ratio);
  shape.rows = static_workspace_rows(config, compress_ratio);
  shape.index_rows = config.max_num_batched_tokens;
  shape.index_width = combined_index_width(config, *type);
  return shape;
}

Expected<PrefillWorkspaceShape> chunk_prefill_workspace(const StepConfig& config, int compress_ratio,
                                                        const PrefillChunk& chunk) {
  SMLA_RETURN_IF_ERROR(validate_step_config(config));
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  if (chunk.req_end < chunk.req_begin || chunk.token_end < chunk.token_begin || chunk.compressed_rows < 0 ||
      chunk.workspace_rows < chunk.compressed_rows) {
    return invalid_argument(
        "chunk", "ordered ranges and 0 <= compressed_rows <= workspace_rows",
        fmt::format("reqs [{}, {}), tokens [{}, {}), N {}, M {}", chunk.req_begin, chunk.req_end, chunk.token_begin,
                    chunk.token_end, chunk.compressed_rows, chunk.workspace_rows));
  }
  PrefillWorkspaceShape shape;
  shape.chunk_reqs = chunk.req_end - chunk.req_begin;
  shape.compressed_rows = chunk.compressed_rows;
  shape.rows = chunk.workspace_rows;
  shape.index_rows = chunk.token_end - chunk.token_begin;
  shape.index_width = combined_index_width(config, *type);
  return shape;
}

namespace detail {

// A chunk must cover consecutive prefill requests and exactly their tokens.
Status check_chunk(const BatchDescription& batch, const StepCounts& c, const PrefillChunk& chunk) {
  if (chunk.req_begin < c.num_decodes || chunk.req_end > c.num_reqs || chunk.req_begin >= chunk.req_end) {
    return out_of_range("chunk.req_begin/req_end",
                        fmt::format("a non-empty range inside the prefills [{}, {})", c.num_decodes, c.num_reqs),
                        fmt::format("[{}, {})", chunk.req_begin, chunk.req_end));
  }
  std::int64_t token_begin = 0;
  for (std::int64_t r = 0; r < chunk.req_begin; ++r) token_begin += at1<const std::int32_t>(batch.query_lens, r);
  std::int64_t token_end = token_begin;
  for (std::int64_t r = chunk.req_begin; r < chunk.req_end; ++r) {
    token_end += at1<const std::int32_t>(batch.query_lens, r);
  }
  if (chunk.token_begin != token_begin || chunk.token_end != token_end) {
    return invalid_argument("chunk.token_begin/token_end", fmt::format("[{}, {})", token_begin, token_end),
                            fmt::format("[{}, {})", chunk.token_begin, chunk.token_end));
  }
  return Status::Ok();
}

}  // namespace detail

Status combine_topk_swa_indices(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                                const PrefillChunk& chunk, std::int64_t compressed_rows, std::int64_t workspace_rows,
                                const TensorView& topk, const TensorView& out_indices, const TensorView& out_lens) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  Expected<StepCounts> counts = describe_step(batch, config);
  if (!counts) return counts.status();
  SMLA_RETURN_IF_ERROR(detail::check_chunk(batch, *counts, chunk));
  const std::int64_t tokens = chunk.token_end - chunk.token_begin;
  const std::int64_t reqs = chunk.req_end - chunk.req_begin;

  std::int64_t need_compressed = 0, need_gather = 0;
  for (std::int64_t r = chunk.req_begin; r < chunk.req_end; ++r) {
    const PrefillRequest p = prefill_request(batch, config, compress_ratio, r);
    need_compressed = std::max(need_compressed, p.compressed);
    need_gather = std::max(need_gather, p.gather);
  }
  if (compressed_rows > detail::kMaxI32 || workspace_rows > detail::kMaxI32 / std::max<std::int64_t>(reqs, 1)) {
    return out_of_range("compressed_rows/workspace_rows", "chunk requests * workspace_rows <= 2^31 - 1",
                        fmt::format("{} / {} for {} requests", compressed_rows, workspace_rows, reqs));
  }
  if (compressed_rows < need_compressed) {
    return out_of_range("compressed_rows", fmt::format(">= {} (largest seq_len // r of the chunk)", need_compressed),
                        std::to_string(compressed_rows));
  }
  if (workspace_rows < compressed_rows + need_gather) {
    return out_of_range("workspace_rows",
                        fmt::format(">= compressed_rows + largest gather_len = {}", compressed_rows + need_gather),
                        std::to_string(workspace_rows));
  }
  const std::int64_t topk_width = compressed_topk_width(config, *type);
  if (*type == LayerType::kSwaOnly) {
    if (topk.present()) return invalid_argument("topk", "absent for a SWA-only layer", topk.describe());
  } else {
    SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(topk, "topk", DType::kI32, 2));
    SMLA_RETURN_IF_ERROR(detail::check_min_extent(topk, "topk", 0, tokens));
    SMLA_RETURN_IF_ERROR(detail::check_extent(topk, "topk", 1, topk_width));
  }
  const std::int64_t width = combined_index_width(config, *type);
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(out_indices, "out_indices", DType::kI32, 2));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(out_indices, "out_indices", 0, tokens));
  SMLA_RETURN_IF_ERROR(detail::check_extent(out_indices, "out_indices", 1, width));
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(out_lens, "out_lens", DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(out_lens, "out_lens", 0, tokens));

  std::int64_t row = 0;
  for (std::int64_t r = chunk.req_begin; r < chunk.req_end; ++r) {
    const PrefillRequest p = prefill_request(batch, config, compress_ratio, r);
    const std::int64_t base = (r - chunk.req_begin) * workspace_rows;
    const std::int64_t gather_start = p.seq_len - p.gather;
    for (std::int64_t i = 0; i < p.query_len; ++i, ++row) {
      const std::int32_t* topk_row = topk.present() ? row_ptr<const std::int32_t>(topk, row) : nullptr;
      const std::int64_t topk_stride = topk.present() ? topk.stride[1] : 1;
      at1<std::int32_t>(out_lens, row) = detail::write_combined_row(
          topk_row, topk_stride, topk_width, compress_ratio, detail::token_position(p.seq_len, p.query_len, i),
          config.window, base, compressed_rows, gather_start, width, row_ptr<std::int32_t>(out_indices, row),
          out_indices.stride[1]);
    }
  }
  return Status::Ok();
}

}  // namespace smla
