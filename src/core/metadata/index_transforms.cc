// Request-local to global index conversions (spec 4.2, 4.6, 4.7).
#include <fmt/format.h>

#include "smla/metadata.h"
#include "src/core/argument_checks.h"
#include "src/core/metadata/metadata_rules.h"
#include "src/core/strided_access.h"

namespace smla {

using detail::at1;
using detail::row_ptr;

namespace {

Status check_block_size(std::int64_t block_size) {
  if (block_size < 1 || block_size > (1 << 20)) {
    return invalid_argument("block_size", "a value in [1, 2^20]", std::to_string(block_size));
  }
  return Status::Ok();
}

// Common checks of [n, K] local indices, their [n] request ids and the outputs.
Status check_conversion(const TensorView& local, std::string_view local_name, const TensorView& req_ids,
                        std::string_view req_name, const TensorView& table, const TensorView& out,
                        std::string_view out_name) {
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(local, local_name, DType::kI32, 2));
  const std::int64_t n = local.shape[0];
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(req_ids, req_name, DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(detail::check_extent(req_ids, req_name, 0, n));
  SMLA_RETURN_IF_ERROR(detail::check_block_table(table, "block_table", 0));
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(out, out_name, DType::kI32, 2));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(out, out_name, 0, n));
  return detail::check_extent(out, out_name, 1, local.shape[1]);
}

}  // namespace

Status c4a_global_topk_indices(const TensorView& local_topk, const TensorView& token_to_req,
                               const TensorView& is_valid_token, const TensorView& block_table, std::int64_t block_size,
                               const TensorView& global_out, const TensorView& lens_out) {
  SMLA_RETURN_IF_ERROR(check_block_size(block_size));
  SMLA_RETURN_IF_ERROR(
      check_conversion(local_topk, "local_topk", token_to_req, "token_to_req", block_table, global_out, "global_out"));
  const std::int64_t n = local_topk.shape[0];
  const std::int64_t k = local_topk.shape[1];
  if (is_valid_token.present()) {
    SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(is_valid_token, "is_valid_token", DType::kU8, 1));
    SMLA_RETURN_IF_ERROR(detail::check_extent(is_valid_token, "is_valid_token", 0, n));
  }
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(lens_out, "lens_out", DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(lens_out, "lens_out", 0, n));

  for (std::int64_t t = 0; t < n; ++t) {
    const detail::BlockTableRow row = detail::table_row(block_table, at1<const std::int32_t>(token_to_req, t));
    const std::int32_t kept =
        detail::convert_compact_row(row, block_size, row_ptr<const std::int32_t>(local_topk, t), local_topk.stride[1],
                                    k, detail::kMaxI32, k, row_ptr<std::int32_t>(global_out, t), global_out.stride[1]);
    const bool valid = !is_valid_token.present() || at1<const std::uint8_t>(is_valid_token, t) != 0;
    at1<std::int32_t>(lens_out, t) = valid ? kept : 0;
  }
  return Status::Ok();
}

namespace {

// The compressed group's block table for a layer of `type` (nullptr: window only),
// after checking the layer's own arguments.
Expected<const TensorView*> mixed_group_table(const BatchDescription& batch, LayerType type,
                                              const TensorView& c4a_local_topk, std::int64_t tokens,
                                              std::int64_t topk_width) {
  if (type == LayerType::kC4A) {
    if (!batch.c4_block_table.present()) {
      return invalid_argument("batch.c4_block_table", "present for a C4A layer", "absent");
    }
    SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(c4a_local_topk, "c4a_local_topk", DType::kI32, 2));
    SMLA_RETURN_IF_ERROR(detail::check_min_extent(c4a_local_topk, "c4a_local_topk", 0, tokens));
    SMLA_RETURN_IF_ERROR(detail::check_extent(c4a_local_topk, "c4a_local_topk", 1, topk_width));
    return &batch.c4_block_table;
  }
  if (c4a_local_topk.present()) {
    return invalid_argument("c4a_local_topk", "absent unless the layer is C4A", c4a_local_topk.describe());
  }
  if (type != LayerType::kC128A) return static_cast<const TensorView*>(nullptr);
  if (!batch.c128_block_table.present()) {
    return invalid_argument("batch.c128_block_table", "present for a C128A layer", "absent");
  }
  return &batch.c128_block_table;
}

Status check_mixed_outputs(const TensorView& out_indices, const TensorView& out_lens, std::int64_t tokens,
                           std::int64_t width) {
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(out_indices, "out_indices", DType::kI32, 2));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(out_indices, "out_indices", 0, tokens));
  SMLA_RETURN_IF_ERROR(detail::check_extent(out_indices, "out_indices", 1, width));
  if (out_indices.stride[0] % 4 != 0 || out_indices.stride[1] != 1) {
    return invalid_argument("out_indices", "contiguous rows whose stride is a multiple of 4 elements (16 bytes)",
                            out_indices.describe());
  }
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(out_lens, "out_lens", DType::kI32, 1));
  return detail::check_min_extent(out_lens, "out_lens", 0, tokens);
}

}  // namespace

Status mixed_sparse_indices(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                            const TensorView& c4a_local_topk, const TensorView& out_indices,
                            const TensorView& out_lens) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  Expected<StepCounts> counts = describe_step(batch, config);
  if (!counts) return counts.status();
  const std::int64_t tokens = counts->num_tokens;
  const std::int64_t topk_width = compressed_topk_width(config, *type);
  const std::int64_t packed_topk = detail::roundup(topk_width, 4);
  const std::int64_t width = config.window + packed_topk;
  Expected<const TensorView*> group_table = mixed_group_table(batch, *type, c4a_local_topk, tokens, topk_width);
  if (!group_table) return group_table.status();
  SMLA_RETURN_IF_ERROR(check_mixed_outputs(out_indices, out_lens, tokens, width));

  const std::int64_t group_block = compressed_block_size(config, compress_ratio);
  const std::int64_t c128_active = config.c128a_active_width > 0 ? config.c128a_active_width : topk_width;
  std::vector<std::int32_t> c128_local;  // entries 0..n-1, shared by every C128A row
  if (*type == LayerType::kC128A) {
    c128_local.resize(static_cast<std::size_t>(topk_width));
    for (std::int64_t j = 0; j < topk_width; ++j)
      c128_local[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
  }
  std::int64_t t = 0;
  for (std::int64_t r = 0; r < counts->num_reqs; ++r) {
    const std::int64_t q = at1<const std::int32_t>(batch.query_lens, r);
    const std::int64_t s = at1<const std::int32_t>(batch.seq_lens, r);
    const detail::BlockTableRow swa = detail::table_row(batch.swa_block_table, r);
    const detail::BlockTableRow group =
        *group_table != nullptr ? detail::table_row(**group_table, r) : detail::BlockTableRow{};
    for (std::int64_t i = 0; i < q; ++i, ++t) {
      std::int32_t* row = row_ptr<std::int32_t>(out_indices, t);
      const bool valid = !batch.token_valid.present() || at1<const std::uint8_t>(batch.token_valid, t) != 0;
      if (!valid) {
        detail::fill_row(row, 1, 0, width, -1);
        at1<std::int32_t>(out_lens, t) = 0;
        continue;
      }
      const std::int64_t pos = detail::token_position(s, q, i);
      detail::write_window_row(swa, config.swa_page_size, pos, config.window, config.window, row, 1);
      std::int32_t kept = 0;
      const std::int64_t visible = detail::visible_compressed(pos, compress_ratio);
      if (*type == LayerType::kC4A) {
        kept = detail::convert_compact_row(group, group_block, row_ptr<const std::int32_t>(c4a_local_topk, t),
                                           c4a_local_topk.stride[1], detail::min64(visible, topk_width), visible,
                                           packed_topk, row + config.window, 1);
      } else if (*type == LayerType::kC128A) {
        const std::int64_t n = detail::min64(visible, c128_active);
        kept = detail::convert_compact_row(group, group_block, c128_local.data(), 1, n, visible, packed_topk,
                                           row + config.window, 1);
      }
      at1<std::int32_t>(out_lens, t) = static_cast<std::int32_t>(config.window + kept);
    }
  }
  for (; t < tokens; ++t) {
    detail::fill_row(row_ptr<std::int32_t>(out_indices, t), 1, 0, width, -1);
    at1<std::int32_t>(out_lens, t) = 0;
  }
  return Status::Ok();
}

Status v32_request_to_global_indices(const TensorView& req_indices, const TensorView& req_id,
                                     const TensorView& block_table, std::int64_t block_size,
                                     std::int64_t block_stride_rows, const TensorView& out,
                                     const TensorView& valid_counts) {
  SMLA_RETURN_IF_ERROR(check_block_size(block_size));
  SMLA_RETURN_IF_ERROR(check_conversion(req_indices, "req_indices", req_id, "req_id", block_table, out, "out"));
  const std::int64_t stride_rows = block_stride_rows > 0 ? block_stride_rows : block_size;
  if (stride_rows < block_size || stride_rows > (1 << 20)) {
    return invalid_argument("block_stride_rows", fmt::format("<= 0 or a value in [block_size = {}, 2^20]", block_size),
                            std::to_string(block_stride_rows));
  }
  const std::int64_t n = req_indices.shape[0];
  const std::int64_t k = req_indices.shape[1];
  if (valid_counts.present()) {
    SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(valid_counts, "valid_counts", DType::kI32, 1));
    SMLA_RETURN_IF_ERROR(detail::check_min_extent(valid_counts, "valid_counts", 0, n));
  }
  for (std::int64_t t = 0; t < n; ++t) {
    const detail::BlockTableRow row = detail::table_row(block_table, at1<const std::int32_t>(req_id, t));
    const std::int32_t* in = row_ptr<const std::int32_t>(req_indices, t);
    std::int32_t* dst = row_ptr<std::int32_t>(out, t);
    std::int32_t count = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t tok = in[j * req_indices.stride[1]];
      // The padded block stride changes the slot, not which column is read.
      const std::int64_t slot = detail::table_slot(row, block_size, tok);
      std::int64_t global = -1;
      if (slot >= 0) global = (slot / block_size) * stride_rows + tok % block_size;
      if (global > detail::kMaxI32) global = -1;
      dst[j * out.stride[1]] = static_cast<std::int32_t>(global);
      count += global >= 0 ? 1 : 0;
    }
    if (valid_counts.present()) at1<std::int32_t>(valid_counts, t) = count;
  }
  return Status::Ok();
}

}  // namespace smla
