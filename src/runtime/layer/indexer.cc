// Entries of the lightning indexer ops (spec 1.8).
#include "smla/indexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "src/core/argument_checks.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {

using namespace layer_detail;

namespace {

// Host topk: the shortcut decision from the positions, then (without it) every
// request row, block-table column and page the scoring reads.
Status check_topk_values(const IndexerTopkArgs& args, IndexerTopkShape& shape) {
  std::int64_t max_position = -1;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t p = read_index(args.positions, t);
    if (p < 0) return out_of_range(fmt::format("positions[{}]", t), "a position >= 0", std::to_string(p));
    max_position = std::max(max_position, p);
  }
  const std::int64_t max_seq_len = args.max_seq_len >= 0 ? args.max_seq_len : max_position + 1;
  if (max_seq_len < max_position + 1) {
    return invalid_argument("max_seq_len", fmt::format("at least {} (the largest position + 1)", max_position + 1),
                            std::to_string(max_seq_len));
  }
  shape.short_context = args.allow_short_context && max_seq_len / kIndexerRatio <= shape.top_k;
  if (shape.short_context) return Status::Ok();
  SMLA_RETURN_IF_ERROR(validate_indexer_cache(args.key_cache, "key_cache"));
  SMLA_RETURN_IF_ERROR(check_block_table(args.block_table, "block_table", /*min_rows=*/0));
  const TensorView& table = args.block_table;
  const std::int64_t page = args.key_cache.page_size();
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t entries = (read_index(args.positions, t) + 1) / kIndexerRatio;
    if (entries == 0) continue;
    const std::int64_t req = read_index(args.token_to_request, t);
    if (req < 0 || req >= table.shape[0]) {
      return out_of_range(fmt::format("token_to_request[{}]", t), fmt::format("a row in [0, {})", table.shape[0]),
                          std::to_string(req));
    }
    const std::int64_t columns = (entries + page - 1) / page;
    if (columns > table.shape[1]) {
      return out_of_range(fmt::format("block_table[{}]", req), fmt::format("at least {} columns", columns),
                          std::to_string(table.shape[1]));
    }
    for (std::int64_t c = 0; c < columns; ++c) {
      const std::int64_t block = read_table(table, req, c);
      if (block < 0 || block >= args.key_cache.num_pages()) {
        return out_of_range(fmt::format("block_table[{}][{}]", req, c),
                            fmt::format("a page in [0, {})", args.key_cache.num_pages()), std::to_string(block));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Expected<IndexerQueryShape> layer_detail::validate_indexer_query(const IndexerQueryArgs& args, DeviceKind device) {
  if (args.rope == nullptr) return invalid_argument("rope", "a RopeTable", "nullptr");
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.q, "q", {DType::kF32, DType::kBF16}, {kAnyExtent, kAnyExtent, kIndexerHeadDim}, device));
  IndexerQueryShape shape{args.q.shape[0], args.q.shape[1]};
  if (shape.heads < 1) return invalid_argument("q", "at least one head", args.q.shape_string());
  SMLA_RETURN_IF_ERROR(check_tensor(args.weights, "weights", {DType::kF32}, {shape.tokens, shape.heads}, device));
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  if (device == DeviceKind::kCpu) {
    SMLA_RETURN_IF_ERROR(check_positions(args.positions, "positions", args.rope->max_positions()));
  }
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.q_fp8, "q_fp8", {DType::kE4M3}, {shape.tokens, shape.heads, kIndexerHeadDim}, device));
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.head_weights, "head_weights", {DType::kF32}, {shape.tokens, shape.heads}, device));
  return shape;
}

Expected<IndexerTopkShape> layer_detail::validate_indexer_topk(const IndexerTopkArgs& args, DeviceKind device) {
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.q_fp8, "q_fp8", {DType::kE4M3}, {kAnyExtent, kAnyExtent, kIndexerHeadDim}, device));
  IndexerTopkShape shape{args.q_fp8.shape[0], args.q_fp8.shape[1], 0, false, 0};
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.head_weights, "head_weights", {DType::kF32}, {shape.tokens, shape.heads}, device));
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  SMLA_RETURN_IF_ERROR(check_index_vector(args.token_to_request, "token_to_request", shape.tokens, device));
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.topk_indices, "topk_indices", {DType::kI32}, {shape.tokens, kAnyExtent}, device));
  shape.top_k = args.topk_indices.shape[1];
  if (shape.top_k < 1) return invalid_argument("topk_indices", "k >= 1 columns", args.topk_indices.shape_string());
  if (device == DeviceKind::kCpu) {
    SMLA_RETURN_IF_ERROR(check_topk_values(args, shape));
    return shape;
  }
  // The device takes the shortcut per token and scores every entry the table can address.
  SMLA_RETURN_IF_ERROR(check_indexer_cache(args.key_cache, "key_cache", device));
  SMLA_RETURN_IF_ERROR(check_block_table(args.block_table, "block_table", /*min_rows=*/0, device));
  shape.capacity = args.block_table.shape[1] * args.key_cache.page_size();
  return shape;
}

Problem layer_detail::layer_problem(const IndexerQueryArgs&, const IndexerQueryShape& shape) {
  return make_problem(Op::kPrepareIndexerQuery, shape.tokens, shape.heads, kIndexerHeadDim);
}

Problem layer_detail::layer_problem(const IndexerTopkArgs&, const IndexerTopkShape& shape) {
  Problem problem = make_problem(Op::kIndexerTopk, shape.tokens, shape.heads, kIndexerHeadDim);
  problem.keys = shape.capacity;
  return problem;
}

Status prepare_indexer_query(const Context& context, const IndexerQueryArgs& args) {
  return layer_entry(context, "prepare_indexer_query", args, &validate_indexer_query);
}

Status prepare_indexer_query(const IndexerQueryArgs& args, Backend backend) {
  return runtime::with_default_context(backend,
                                       [&](const Context& context) { return prepare_indexer_query(context, args); });
}

Status indexer_topk(const Context& context, const IndexerTopkArgs& args) {
  auto shape = validate_indexer_topk(args, runtime::tensor_device(context));
  if (!shape) return shape.status().with_context("indexer_topk: ");
  if (shape->short_context) return fill_short_context_topk(args.positions, args.topk_indices);
  return run_layer_op(context, args, *shape).with_context("indexer_topk: ");
}

Expected<std::size_t> indexer_topk_workspace_size(const Context& context, const IndexerTopkArgs& args) {
  return layer_entry_workspace_size(context, "indexer_topk", args, &validate_indexer_topk);
}

Status indexer_topk(const IndexerTopkArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return indexer_topk(context, args); });
}

Status fill_short_context_topk(const TensorView& positions, const TensorView& topk_indices) {
  SMLA_RETURN_IF_ERROR(check_tensor(topk_indices, "topk_indices", {DType::kI32}, {kAnyExtent, kAnyExtent})
                           .with_context("fill_short_context_topk: "));
  const std::int64_t tokens = topk_indices.shape[0];
  SMLA_RETURN_IF_ERROR(check_index_vector(positions, "positions", tokens).with_context("fill_short_context_topk: "));
  SMLA_RETURN_IF_ERROR(
      check_positions(positions, "positions", INT64_MAX).with_context("fill_short_context_topk: "));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t entries = (read_index(positions, t) + 1) / kIndexerRatio;
    std::int32_t* row = topk_indices.ptr<std::int32_t>() + t * topk_indices.stride[0];
    for (std::int64_t j = 0; j < topk_indices.shape[1]; ++j) row[j] = j < entries ? static_cast<std::int32_t>(j) : -1;
  }
  return Status::Ok();
}

}  // namespace smla
