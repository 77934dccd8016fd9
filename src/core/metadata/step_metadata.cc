// The per-step metadata builder (spec 3.1-3.3, 4.1, 4.3, 4.8).
#include <fmt/format.h>

#include <algorithm>

#include "smla/metadata.h"
#include "src/core/argument_checks.h"
#include "src/core/metadata/metadata_rules.h"
#include "src/core/strided_access.h"

namespace smla {

using detail::at1;
using detail::cdiv;
using detail::check_block_table;
using detail::check_extent;
using detail::check_min_extent;
using detail::check_strided_tensor;
using detail::row_ptr;
using detail::table_row;

namespace {

// Every block id a request's lookups may read must be >= 0 and keep its slots inside i32.
Status check_table_ids(const TensorView& table, std::string_view name, std::int64_t req, std::int64_t page_size,
                       std::int64_t first_entry, std::int64_t end_entry) {
  if (end_entry <= first_entry) return Status::Ok();
  const std::int64_t needed_cols = cdiv(end_entry, page_size);
  if (table.shape[1] < needed_cols) {
    return out_of_range(name,
                        fmt::format("at least {} columns for request {} ({} entries of {} per page)", needed_cols, req,
                                    end_entry, page_size),
                        fmt::format("{} columns", table.shape[1]));
  }
  const std::int64_t max_block = (detail::kMaxI32 - (page_size - 1)) / page_size;
  const detail::BlockTableRow row = table_row(table, req);
  for (std::int64_t col = first_entry / page_size; col < needed_cols; ++col) {
    const std::int64_t block = row.data[col * row.col_stride];
    if (block < 0 || block > max_block) {
      return out_of_range(fmt::format("{}[{}][{}]", name, req, col),
                          fmt::format("a block id in [0, {}] (slots must fit i32)", max_block), std::to_string(block));
    }
  }
  return Status::Ok();
}

Status check_group_table(const TensorView& table, std::string_view name, const StepConfig& config, int ratio,
                         std::int64_t num_reqs, const TensorView& query_lens, const TensorView& seq_lens) {
  SMLA_RETURN_IF_ERROR(check_block_table(table, name, num_reqs));
  const std::int64_t page = compressed_block_size(config, ratio);
  for (std::int64_t r = 0; r < num_reqs; ++r) {
    if (at1<const std::int32_t>(query_lens, r) == 0) continue;  // nothing of it is read
    const std::int64_t entries = at1<const std::int32_t>(seq_lens, r) / ratio;
    SMLA_RETURN_IF_ERROR(check_table_ids(table, name, r, page, 0, entries));
  }
  return Status::Ok();
}

// The per-request counts of `c` (num_reqs set) from the lengths, checking each
// request: lengths in range, the token budget, decode-first order.
Status count_requests(const BatchDescription& batch, const StepConfig& config, StepCounts& c) {
  const std::int64_t threshold = config.decode_threshold();
  std::int64_t first_prefill = -1;
  for (std::int64_t r = 0; r < c.num_reqs; ++r) {
    const std::int64_t q = at1<const std::int32_t>(batch.query_lens, r);
    const std::int64_t s = at1<const std::int32_t>(batch.seq_lens, r);
    if (q < 0) return invalid_argument(fmt::format("batch.query_lens[{}]", r), ">= 0", std::to_string(q));
    if (s < q) {
      return invalid_argument(fmt::format("batch.seq_lens[{}]", r),
                              fmt::format(">= query_lens[{}] = {} (the context includes this step)", r, q),
                              std::to_string(s));
    }
    if (s > config.max_model_len) {
      return out_of_range(fmt::format("batch.seq_lens[{}]", r),
                          fmt::format("<= config.max_model_len = {}", config.max_model_len), std::to_string(s));
    }
    c.num_actual_tokens += q;
    if (c.num_actual_tokens > config.max_num_batched_tokens) {
      return out_of_range("batch.query_lens",
                          fmt::format("a sum <= config.max_num_batched_tokens = {}", config.max_num_batched_tokens),
                          fmt::format("more (reached {} at request {})", c.num_actual_tokens, r));
    }
    if (q > threshold && first_prefill < 0) first_prefill = r;
    if (first_prefill >= 0 && q <= threshold) {
      return invalid_argument(
          fmt::format("batch.query_lens[{}]", r),
          fmt::format("> decode threshold {} (batch ordered decode-first; request {} with "
                      "query_len {} starts the prefills)",
                      threshold, first_prefill, at1<const std::int32_t>(batch.query_lens, first_prefill)),
          std::to_string(q));
    }
    c.max_query_len = std::max(c.max_query_len, q);
    c.max_seq_len = std::max(c.max_seq_len, s);
    if (first_prefill < 0) {
      c.max_decode_query_len = std::max(c.max_decode_query_len, q);
      c.num_decode_tokens += q;
    } else {
      c.max_prefill_query_len = std::max(c.max_prefill_query_len, q);
      c.num_prefill_tokens += q;
    }
  }
  c.num_decodes = first_prefill < 0 ? c.num_reqs : first_prefill;
  c.num_prefills = c.num_reqs - c.num_decodes;
  return Status::Ok();
}

// The three block tables: every block id a request's positions reach this step.
Status check_step_tables(const BatchDescription& batch, const StepConfig& config, const StepCounts& c) {
  // Sliding-window table: the window of the first query token (= the prefill
  // gather start) up to the last position.
  SMLA_RETURN_IF_ERROR(check_block_table(batch.swa_block_table, "batch.swa_block_table", c.num_reqs));
  for (std::int64_t r = 0; r < c.num_reqs; ++r) {
    const std::int64_t q = at1<const std::int32_t>(batch.query_lens, r);
    if (q == 0) continue;
    const std::int64_t s = at1<const std::int32_t>(batch.seq_lens, r);
    const std::int64_t first = detail::max64(s - q - config.window + 1, 0);
    SMLA_RETURN_IF_ERROR(
        check_table_ids(batch.swa_block_table, "batch.swa_block_table", r, config.swa_page_size, first, s));
  }
  if (batch.c4_block_table.present()) {
    SMLA_RETURN_IF_ERROR(check_group_table(batch.c4_block_table, "batch.c4_block_table", config, 4, c.num_reqs,
                                           batch.query_lens, batch.seq_lens));
  }
  if (batch.c128_block_table.present()) {
    SMLA_RETURN_IF_ERROR(check_group_table(batch.c128_block_table, "batch.c128_block_table", config, 128, c.num_reqs,
                                           batch.query_lens, batch.seq_lens));
  }
  return Status::Ok();
}

}  // namespace

Expected<StepCounts> describe_step(const BatchDescription& batch, const StepConfig& config) {
  SMLA_RETURN_IF_ERROR(validate_step_config(config));
  SMLA_RETURN_IF_ERROR(check_strided_tensor(batch.query_lens, "batch.query_lens", DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(check_strided_tensor(batch.seq_lens, "batch.seq_lens", DType::kI32, 1));
  StepCounts c;
  c.num_reqs = batch.query_lens.shape[0];
  SMLA_RETURN_IF_ERROR(check_extent(batch.seq_lens, "batch.seq_lens", 0, c.num_reqs));
  SMLA_RETURN_IF_ERROR(count_requests(batch, config, c));
  c.num_tokens = batch.num_tokens < 0 ? c.num_actual_tokens : batch.num_tokens;
  if (batch.num_tokens < -1 || c.num_tokens < c.num_actual_tokens || c.num_tokens > config.max_num_batched_tokens) {
    return out_of_range("batch.num_tokens",
                        fmt::format("-1 or a value in [sum(query_lens) = {}, max_num_batched_tokens = {}]",
                                    c.num_actual_tokens, config.max_num_batched_tokens),
                        std::to_string(batch.num_tokens));
  }
  if (batch.token_valid.present()) {
    SMLA_RETURN_IF_ERROR(check_strided_tensor(batch.token_valid, "batch.token_valid", DType::kU8, 1));
    SMLA_RETURN_IF_ERROR(check_extent(batch.token_valid, "batch.token_valid", 0, c.num_tokens));
  }
  SMLA_RETURN_IF_ERROR(check_step_tables(batch, config, c));
  return c;
}

Expected<StepMetadataSizes> step_metadata_sizes(const BatchDescription& batch, const StepConfig& config) {
  Expected<StepCounts> counts = describe_step(batch, config);
  if (!counts) return counts.status();
  StepMetadataSizes s;
  s.counts = *counts;
  s.window = config.window;
  s.has_c4 = batch.c4_block_table.present();
  s.has_c128 = batch.c128_block_table.present();
  s.c128a_width = s.has_c128 ? c128a_width(config) : 0;
  s.query_start_loc_rows = s.counts.num_reqs + 1;
  s.token_rows = s.counts.num_tokens;
  s.prefill_request_rows = s.counts.num_prefills;
  s.c128a_decode_rows = s.has_c128 ? s.counts.num_decode_tokens : 0;
  s.c128a_prefill_rows = s.has_c128 ? s.counts.num_prefill_tokens : 0;
  return s;
}

namespace {

Status check_vector(const TensorView& v, std::string_view name, DType dtype, std::int64_t rows) {
  SMLA_RETURN_IF_ERROR(check_strided_tensor(v, name, dtype, 1));
  return check_min_extent(v, name, 0, rows);
}

Status check_matrix(const TensorView& v, std::string_view name, std::int64_t rows, std::int64_t width) {
  SMLA_RETURN_IF_ERROR(check_strided_tensor(v, name, DType::kI32, 2));
  SMLA_RETURN_IF_ERROR(check_min_extent(v, name, 0, rows));
  return check_extent(v, name, 1, width);
}

Status check_group_absent(const TensorView& v, std::string_view name, std::string_view table) {
  if (v.present()) return invalid_argument(name, fmt::format("absent (batch.{} is absent)", table), v.describe());
  return Status::Ok();
}

Status check_buffers(const StepMetadataSizes& s, const StepMetadataBuffers& o) {
  const std::int64_t t = s.token_rows;
  SMLA_RETURN_IF_ERROR(check_vector(o.query_start_loc, "out.query_start_loc", DType::kI32, s.query_start_loc_rows));
  SMLA_RETURN_IF_ERROR(check_vector(o.token_to_req, "out.token_to_req", DType::kI32, t));
  SMLA_RETURN_IF_ERROR(check_vector(o.positions, "out.positions", DType::kI64, t));
  SMLA_RETURN_IF_ERROR(check_vector(o.is_valid_token, "out.is_valid_token", DType::kU8, t));
  SMLA_RETURN_IF_ERROR(check_vector(o.swa_slot_mapping, "out.swa_slot_mapping", DType::kI64, t));
  SMLA_RETURN_IF_ERROR(check_matrix(o.swa_indices, "out.swa_indices", t, s.window));
  SMLA_RETURN_IF_ERROR(check_vector(o.swa_lens, "out.swa_lens", DType::kI32, t));
  SMLA_RETURN_IF_ERROR(
      check_vector(o.prefill_gather_lens, "out.prefill_gather_lens", DType::kI32, s.prefill_request_rows));
  if (s.has_c4) {
    SMLA_RETURN_IF_ERROR(check_vector(o.c4_slot_mapping, "out.c4_slot_mapping", DType::kI64, t));
  } else {
    SMLA_RETURN_IF_ERROR(check_group_absent(o.c4_slot_mapping, "out.c4_slot_mapping", "c4_block_table"));
  }
  if (s.has_c128) {
    SMLA_RETURN_IF_ERROR(check_vector(o.c128_slot_mapping, "out.c128_slot_mapping", DType::kI64, t));
    SMLA_RETURN_IF_ERROR(
        check_matrix(o.c128a_decode_indices, "out.c128a_decode_indices", s.c128a_decode_rows, s.c128a_width));
    SMLA_RETURN_IF_ERROR(check_vector(o.c128a_decode_lens, "out.c128a_decode_lens", DType::kI32, s.c128a_decode_rows));
    SMLA_RETURN_IF_ERROR(
        check_matrix(o.c128a_prefill_indices, "out.c128a_prefill_indices", s.c128a_prefill_rows, s.c128a_width));
  } else {
    SMLA_RETURN_IF_ERROR(check_group_absent(o.c128_slot_mapping, "out.c128_slot_mapping", "c128_block_table"));
    SMLA_RETURN_IF_ERROR(check_group_absent(o.c128a_decode_indices, "out.c128a_decode_indices", "c128_block_table"));
    SMLA_RETURN_IF_ERROR(check_group_absent(o.c128a_decode_lens, "out.c128a_decode_lens", "c128_block_table"));
    SMLA_RETURN_IF_ERROR(check_group_absent(o.c128a_prefill_indices, "out.c128a_prefill_indices", "c128_block_table"));
  }
  return Status::Ok();
}

// Writes the fields of one token; padding tokens get -1 rows and zero lengths.
struct TokenWriter {
  const StepConfig& config;
  const StepMetadataSizes& sizes;
  const StepMetadataBuffers& out;
  std::int64_t c128_active;

  void write(std::int64_t t, std::int64_t req, std::int64_t pos, bool valid, bool is_decode,
             const detail::BlockTableRow& swa, const detail::BlockTableRow& c4,
             const detail::BlockTableRow& c128) const {
    at1<std::int32_t>(out.token_to_req, t) = static_cast<std::int32_t>(req);
    at1<std::int64_t>(out.positions, t) = req < 0 ? 0 : pos;
    at1<std::uint8_t>(out.is_valid_token, t) = valid ? 1 : 0;
    at1<std::int64_t>(out.swa_slot_mapping, t) = valid ? detail::table_slot(swa, config.swa_page_size, pos) : -1;
    std::int32_t* window_row = row_ptr<std::int32_t>(out.swa_indices, t);
    const std::int64_t window_stride = out.swa_indices.stride[1];
    if (valid) {
      at1<std::int32_t>(out.swa_lens, t) = detail::write_window_row(swa, config.swa_page_size, pos, config.window,
                                                                    config.window, window_row, window_stride);
    } else {
      detail::fill_row(window_row, window_stride, 0, config.window, -1);
      at1<std::int32_t>(out.swa_lens, t) = 0;
    }
    if (sizes.has_c4) {
      at1<std::int64_t>(out.c4_slot_mapping, t) =
          valid ? detail::compressed_slot_mapping(c4, 4, compressed_block_size(config, 4), pos) : -1;
    }
    if (!sizes.has_c128) return;
    const std::int64_t c128_block = compressed_block_size(config, 128);
    at1<std::int64_t>(out.c128_slot_mapping, t) =
        valid ? detail::compressed_slot_mapping(c128, 128, c128_block, pos) : -1;
    if (req < 0) return;  // trailing padding has no C128A row
    const std::int64_t n = detail::min64(detail::visible_compressed(pos, 128), c128_active);
    if (is_decode) {
      std::int32_t* row = row_ptr<std::int32_t>(out.c128a_decode_indices, t);
      const std::int64_t stride = out.c128a_decode_indices.stride[1];
      if (valid) {
        detail::write_c128a_decode_row(c128, c128_block, n, sizes.c128a_width, row, stride);
      } else {
        detail::fill_row(row, stride, 0, sizes.c128a_width, -1);
      }
      at1<std::int32_t>(out.c128a_decode_lens, t) = valid ? static_cast<std::int32_t>(n) : 0;
    } else {
      const std::int64_t prefill_row = t - sizes.counts.num_decode_tokens;
      detail::write_c128a_local_row(n, sizes.c128a_width, row_ptr<std::int32_t>(out.c128a_prefill_indices, prefill_row),
                                    out.c128a_prefill_indices.stride[1]);
    }
  }
};

}  // namespace

Expected<StepCounts> build_step_metadata(const BatchDescription& batch, const StepConfig& config,
                                         const StepMetadataBuffers& out) {
  Expected<StepMetadataSizes> sizes_or = step_metadata_sizes(batch, config);
  if (!sizes_or) return sizes_or.status();
  const StepMetadataSizes& sizes = *sizes_or;
  SMLA_RETURN_IF_ERROR(check_buffers(sizes, out));

  const StepCounts& c = sizes.counts;
  const std::int64_t c128_active = config.c128a_active_width > 0 ? config.c128a_active_width : sizes.c128a_width;
  const TokenWriter writer{config, sizes, out, c128_active};
  const bool has_valid_mask = batch.token_valid.present();
  std::int64_t t = 0;
  at1<std::int32_t>(out.query_start_loc, 0) = 0;
  for (std::int64_t r = 0; r < c.num_reqs; ++r) {
    const std::int64_t q = at1<const std::int32_t>(batch.query_lens, r);
    const std::int64_t s = at1<const std::int32_t>(batch.seq_lens, r);
    const bool is_decode = r < c.num_decodes;
    const detail::BlockTableRow swa = table_row(batch.swa_block_table, r);
    const detail::BlockTableRow c4 = sizes.has_c4 ? table_row(batch.c4_block_table, r) : detail::BlockTableRow{};
    const detail::BlockTableRow c128 = sizes.has_c128 ? table_row(batch.c128_block_table, r) : detail::BlockTableRow{};
    for (std::int64_t i = 0; i < q; ++i, ++t) {
      const bool valid = !has_valid_mask || at1<const std::uint8_t>(batch.token_valid, t) != 0;
      writer.write(t, r, detail::token_position(s, q, i), valid, is_decode, swa, c4, c128);
    }
    at1<std::int32_t>(out.query_start_loc, r + 1) = static_cast<std::int32_t>(t);
    if (!is_decode) {
      at1<std::int32_t>(out.prefill_gather_lens, r - c.num_decodes) =
          static_cast<std::int32_t>(detail::prefill_gather_len(s, q, config.window));
    }
  }
  for (; t < c.num_tokens; ++t) writer.write(t, -1, 0, false, false, {}, {}, {});
  return c;
}

StepMetadataBuffers StepMetadata::buffers() {
  const StepMetadataSizes& s = sizes;
  const std::int64_t t = s.token_rows;
  StepMetadataBuffers b;
  b.query_start_loc = TensorView::contiguous(query_start_loc.data(), DType::kI32, {s.query_start_loc_rows});
  b.token_to_req = TensorView::contiguous(token_to_req.data(), DType::kI32, {t});
  b.positions = TensorView::contiguous(positions.data(), DType::kI64, {t});
  b.is_valid_token = TensorView::contiguous(is_valid_token.data(), DType::kU8, {t});
  b.swa_slot_mapping = TensorView::contiguous(swa_slot_mapping.data(), DType::kI64, {t});
  b.swa_indices = TensorView::contiguous(swa_indices.data(), DType::kI32, {t, s.window});
  b.swa_lens = TensorView::contiguous(swa_lens.data(), DType::kI32, {t});
  b.prefill_gather_lens = TensorView::contiguous(prefill_gather_lens.data(), DType::kI32, {s.prefill_request_rows});
  if (s.has_c4) b.c4_slot_mapping = TensorView::contiguous(c4_slot_mapping.data(), DType::kI64, {t});
  if (s.has_c128) {
    b.c128_slot_mapping = TensorView::contiguous(c128_slot_mapping.data(), DType::kI64, {t});
    b.c128a_decode_indices =
        TensorView::contiguous(c128a_decode_indices.data(), DType::kI32, {s.c128a_decode_rows, s.c128a_width});
    b.c128a_decode_lens = TensorView::contiguous(c128a_decode_lens.data(), DType::kI32, {s.c128a_decode_rows});
    b.c128a_prefill_indices =
        TensorView::contiguous(c128a_prefill_indices.data(), DType::kI32, {s.c128a_prefill_rows, s.c128a_width});
  }
  return b;
}

Expected<StepMetadata> make_step_metadata(const BatchDescription& batch, const StepConfig& config) {
  Expected<StepMetadataSizes> sizes = step_metadata_sizes(batch, config);
  if (!sizes) return sizes.status();
  StepMetadata m;
  m.sizes = *sizes;
  const auto t = static_cast<std::size_t>(m.sizes.token_rows);
  m.query_start_loc.resize(static_cast<std::size_t>(m.sizes.query_start_loc_rows));
  m.token_to_req.resize(t);
  m.positions.resize(t);
  m.is_valid_token.resize(t);
  m.swa_slot_mapping.resize(t);
  m.swa_indices.resize(t * static_cast<std::size_t>(m.sizes.window));
  m.swa_lens.resize(t);
  m.prefill_gather_lens.resize(static_cast<std::size_t>(m.sizes.prefill_request_rows));
  if (m.sizes.has_c4) m.c4_slot_mapping.resize(t);
  if (m.sizes.has_c128) {
    const auto w = static_cast<std::size_t>(m.sizes.c128a_width);
    m.c128_slot_mapping.resize(t);
    m.c128a_decode_indices.resize(static_cast<std::size_t>(m.sizes.c128a_decode_rows) * w);
    m.c128a_decode_lens.resize(static_cast<std::size_t>(m.sizes.c128a_decode_rows));
    m.c128a_prefill_indices.resize(static_cast<std::size_t>(m.sizes.c128a_prefill_rows) * w);
  }
  Expected<StepCounts> built = build_step_metadata(batch, config, m.buffers());
  if (!built) return built.status();
  return m;
}

}  // namespace smla
