// Entry of the compressor op (spec 1.7): validation of every index it may follow.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "smla/compressor.h"
#include "src/core/argument_checks.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/runtime/layer/compressor_state.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {

using namespace layer_detail;

namespace {

// The state slot of (req, position), or an error naming the first bad index.
Expected<std::int64_t> checked_state_slot(const CompressorArgs& args, const CompressorShape& shape, std::int64_t t,
                                          std::int64_t position) {
  const std::int64_t req = read_index(args.token_to_request, t);
  const TensorView& table = args.state_block_table;
  if (req < 0 || req >= table.shape[0]) {
    return out_of_range(fmt::format("token_to_request[{}]", t), fmt::format("a row in [0, {})", table.shape[0]),
                        std::to_string(req));
  }
  const std::int64_t column = position / shape.state_block_size;
  if (column >= table.shape[1]) {
    return out_of_range(fmt::format("state_block_table[{}]", req),
                        fmt::format("a column for position {} (block {})", position, column),
                        fmt::format("{} columns", table.shape[1]));
  }
  const std::int64_t block = read_table(table, req, column);
  if (block < 0 || block >= args.state_cache.shape[0]) {
    return out_of_range(fmt::format("state_block_table[{}][{}]", req, column),
                        fmt::format("a block in [0, {})", args.state_cache.shape[0]), std::to_string(block));
  }
  return block * shape.state_block_size + position % shape.state_block_size;
}

// Every index the host kernels may follow: slots, requests, block-table
// columns and blocks of each token's saves and emission.
Status check_compressor_values(const CompressorArgs& args, const CompressorShape& shape) {
  SMLA_RETURN_IF_ERROR(check_positions(args.positions, "positions", args.rope->max_positions()));
  const std::int64_t destination_slots = args.kv_cache ? args.kv_cache->num_slots() : args.index_cache->num_slots();
  SMLA_RETURN_IF_ERROR(check_slots(args.compressed_slot_mapping, "compressed_slot_mapping", destination_slots));
  const std::int64_t window = static_cast<std::int64_t>(shape.coff) * shape.ratio;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t position = read_index(args.positions, t);
    const std::int64_t state = read_index(args.state_slot_mapping, t);
    const std::int64_t compressed = read_index(args.compressed_slot_mapping, t);
    if (state < -1) {
      return out_of_range(fmt::format("state_slot_mapping[{}]", t), "-1 or a slot >= 0", std::to_string(state));
    }
    if (compressed >= 0 && (position + 1) % shape.ratio != 0) {
      return invalid_argument(fmt::format("compressed_slot_mapping[{}]", t),
                              fmt::format("-1 for position {} (not the last of a window of {})", position, shape.ratio),
                              std::to_string(compressed));
    }
    if (state < 0) continue;
    auto own = checked_state_slot(args, shape, t, position);
    if (!own) return own.status();
    if (*own != state) {
      return invalid_argument(fmt::format("state_slot_mapping[{}]", t),
                              fmt::format("{} (the block-table slot of position {})", *own, position),
                              std::to_string(state));
    }
    if (compressed < 0) continue;
    for (std::int64_t p = std::max<std::int64_t>(position - window + 1, 0); p <= position; ++p) {
      auto read = checked_state_slot(args, shape, t, p);
      if (!read) return read.status();
    }
  }
  return Status::Ok();
}

// The scalar arguments; the shape's geometry.
Expected<CompressorShape> compressor_geometry(const CompressorArgs& args) {
  if (args.ratio != 4 && args.ratio != 128) {
    return invalid_argument("ratio", "4 or 128", std::to_string(args.ratio));
  }
  if (args.rope == nullptr) return invalid_argument("rope", "a RopeTable", "nullptr");
  if (args.kv_cache.has_value() == args.index_cache.has_value()) {
    return invalid_argument("destination", "exactly one of kv_cache and index_cache",
                            args.kv_cache ? "both" : "neither");
  }
  if (!(args.eps > 0.0f && std::isfinite(args.eps))) {
    return invalid_argument("eps", "a finite value > 0", fmt::format("{}", args.eps));
  }
  CompressorShape shape;
  shape.ratio = args.ratio;
  shape.coff = compressor_coff(args.ratio);
  shape.head_dim = args.kv_cache ? V4Fp8Format::kHeadDim : IndexerFp8Format::kHeadDim;
  shape.state_width = compressor_state_width(args.ratio, shape.head_dim);
  return shape;
}

}  // namespace

Expected<CompressorShape> layer_detail::validate_compressor(const CompressorArgs& args, DeviceKind device) {
  auto geometry = compressor_geometry(args);
  if (!geometry) return geometry.status();
  CompressorShape shape = *geometry;
  const std::int64_t half = shape.coff * shape.head_dim;
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.kv_score, "kv_score", {DType::kF32}, {kAnyExtent, shape.state_width}, device));
  shape.tokens = args.kv_score.shape[0];
  SMLA_RETURN_IF_ERROR(check_tensor(args.ape, "ape", {DType::kF32}, {args.ratio, half}, device));
  SMLA_RETURN_IF_ERROR(check_tensor(args.norm_weight, "norm_weight", {DType::kF32}, {shape.head_dim}, device));
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  SMLA_RETURN_IF_ERROR(check_index_vector(args.token_to_request, "token_to_request", shape.tokens, device));
  SMLA_RETURN_IF_ERROR(check_tensor(args.state_cache, "state_cache", {DType::kF32},
                                    {kAnyExtent, kAnyExtent, shape.state_width}, device));
  if (args.state_cache.shape[1] < 1) {
    return invalid_argument("state_cache", "block_size >= 1", args.state_cache.shape_string());
  }
  shape.state_block_size = args.state_cache.shape[1];
  SMLA_RETURN_IF_ERROR(check_block_table(args.state_block_table, "state_block_table", /*min_rows=*/0, device));
  SMLA_RETURN_IF_ERROR(check_index_vector(args.state_slot_mapping, "state_slot_mapping", shape.tokens, device));
  SMLA_RETURN_IF_ERROR(
      check_index_vector(args.compressed_slot_mapping, "compressed_slot_mapping", shape.tokens, device));
  SMLA_RETURN_IF_ERROR(args.kv_cache ? validate_row_cache_512(*args.kv_cache, "kv_cache", device)
                                     : check_indexer_cache(*args.index_cache, "index_cache", device));
  if (device == DeviceKind::kCpu) SMLA_RETURN_IF_ERROR(check_compressor_values(args, shape));
  return shape;
}

Problem layer_detail::layer_problem(const CompressorArgs& args, const CompressorShape& shape) {
  Problem problem = make_problem(Op::kRunCompressor, shape.tokens, 1, shape.head_dim);
  if (args.kv_cache) problem.format = args.kv_cache->format;
  return problem;
}

Status run_compressor(const Context& context, const CompressorArgs& args) {
  return layer_entry(context, "run_compressor", args, &validate_compressor);
}

Status run_compressor(const CompressorArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return run_compressor(context, args); });
}

}  // namespace smla
