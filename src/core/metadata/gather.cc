// Dequantize-and-gather of paged caches into the bf16 prefill workspace (spec 4.5).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "smla/metadata.h"
#include "smla/numeric.h"
#include "src/core/argument_checks.h"
#include "src/core/kv_rows.h"
#include "src/core/metadata/metadata_rules.h"
#include "src/core/strided_access.h"

namespace smla {

using detail::at1;

namespace {

// Positions [seq_len - gather, seq_len) of one request, already validated.
struct GatherJob {
  std::int64_t seq_len;
  std::int64_t gather;
  detail::BlockTableRow row;
  std::int64_t out_batch;
};

Status validate_jobs(const KvCacheView& cache, const std::vector<GatherJob>& jobs, std::int64_t offset,
                     const TensorView& out, std::string_view table_name) {
  const std::int64_t page = cache.page_size();
  for (const GatherJob& job : jobs) {
    const std::int64_t b = job.out_batch;
    if (job.gather < 0 || job.gather > job.seq_len) {
      return out_of_range(fmt::format("gather_lens[{}]", b), fmt::format("a value in [0, seq_len = {}]", job.seq_len),
                          std::to_string(job.gather));
    }
    if (offset + job.gather > out.shape[1]) {
      return out_of_range(
          "out", fmt::format("dimension 1 of at least offset + gather = {} for request {}", offset + job.gather, b),
          out.shape_string());
    }
    if (job.gather == 0) continue;
    const std::int64_t needed_cols = detail::cdiv(job.seq_len, page);
    if (job.row.num_cols < needed_cols) {
      return out_of_range(
          table_name,
          fmt::format("at least {} columns for request {} (seq_len {}, page {})", needed_cols, b, job.seq_len, page),
          fmt::format("{} columns", job.row.num_cols));
    }
    for (std::int64_t col = (job.seq_len - job.gather) / page; col < needed_cols; ++col) {
      const std::int64_t block = job.row.data[col * job.row.col_stride];
      if (block < 0 || block >= cache.num_pages()) {
        return out_of_range(fmt::format("{}[{}][{}]", table_name, b, col),
                            fmt::format("a page in [0, {})", cache.num_pages()), std::to_string(block));
      }
    }
  }
  return Status::Ok();
}

template <class Format>
void run_jobs(const KvCacheView& cache, const std::vector<GatherJob>& jobs, std::int64_t offset,
              const TensorView& out) {
  const std::int64_t page = cache.page_size();
  const auto* base = static_cast<const std::uint8_t*>(cache.pages.data);
  const std::int64_t page_stride = cache.page_stride_bytes();
  float row[Format::kHeadDim];
  for (const GatherJob& job : jobs) {
    for (std::int64_t i = 0; i < job.gather; ++i) {
      const std::int64_t pos = job.seq_len - job.gather + i;
      const std::int64_t block = job.row.data[(pos / page) * job.row.col_stride];
      detail::decode_token<Format>(base + block * page_stride, page, pos % page, cache.fp8_scale, row);
      auto* dst = static_cast<std::uint16_t*>(out.data) + job.out_batch * out.stride[0] + (offset + i) * out.stride[1];
      for (int d = 0; d < Format::kHeadDim; ++d) dst[d * out.stride[2]] = f32_to_bf16(row[d]);
    }
  }
}

Status validate_gather(const KvCacheView& cache, const std::vector<GatherJob>& jobs, std::int64_t offset,
                       const TensorView& out, std::string_view table_name) {
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, "cache"));
  SMLA_RETURN_IF_ERROR(detail::check_device(cache.pages, "cache.pages", DeviceKind::kCpu));
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(out, "out", DType::kBF16, 3));
  SMLA_RETURN_IF_ERROR(detail::check_extent(out, "out", 2, kv_format_info(cache.format).head_dim));
  if (offset < 0 || offset > out.shape[1]) {
    return out_of_range("offset", fmt::format("a value in [0, out rows = {}]", out.shape[1]), std::to_string(offset));
  }
  for (const GatherJob& job : jobs) {
    if (job.out_batch >= out.shape[0]) {
      return out_of_range("out", fmt::format("dimension 0 of at least {}", job.out_batch + 1), out.shape_string());
    }
  }
  return validate_jobs(cache, jobs, offset, out, table_name);
}

// Validates everything first, then writes.
Status gather_jobs(const KvCacheView& cache, const std::vector<GatherJob>& jobs, std::int64_t offset,
                   const TensorView& out, std::string_view table_name) {
  SMLA_RETURN_IF_ERROR(validate_gather(cache, jobs, offset, out, table_name));
  visit_kv_format(cache.format, [&](auto traits) {
    run_jobs<decltype(traits)>(cache, jobs, offset, out);
    return 0;
  });
  return Status::Ok();
}

}  // namespace

Status dequantize_and_gather(const KvCacheView& cache, const TensorView& seq_lens, const TensorView& gather_lens,
                             const TensorView& block_table, std::int64_t offset, const TensorView& out) {
  SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(seq_lens, "seq_lens", DType::kI32, 1));
  const std::int64_t batch = seq_lens.shape[0];
  if (gather_lens.present()) {
    SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(gather_lens, "gather_lens", DType::kI32, 1));
    SMLA_RETURN_IF_ERROR(detail::check_extent(gather_lens, "gather_lens", 0, batch));
  }
  SMLA_RETURN_IF_ERROR(detail::check_block_table(block_table, "block_table", batch));
  std::vector<GatherJob> jobs;
  jobs.reserve(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t s = at1<const std::int32_t>(seq_lens, b);
    if (s < 0) return out_of_range(fmt::format("seq_lens[{}]", b), ">= 0", std::to_string(s));
    const std::int64_t g = gather_lens.present() ? at1<const std::int32_t>(gather_lens, b) : s;
    jobs.push_back({s, g, detail::table_row(block_table, b), b});
  }
  return gather_jobs(cache, jobs, offset, out, "block_table");
}

namespace detail {
Status check_chunk(const BatchDescription& batch, const StepCounts& c, const PrefillChunk& chunk);
}  // namespace detail

Status gather_prefill_chunk(const BatchDescription& batch, const StepConfig& config, int compress_ratio,
                            const PrefillChunk& chunk, std::int64_t compressed_rows, const KvCacheView& swa_cache,
                            const KvCacheView& compressed_cache, const TensorView& out) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  Expected<StepCounts> counts = describe_step(batch, config);
  if (!counts) return counts.status();
  SMLA_RETURN_IF_ERROR(detail::check_chunk(batch, *counts, chunk));
  if (swa_cache.page_size() != config.swa_page_size) {
    return invalid_argument("swa_cache", fmt::format("page size config.swa_page_size = {}", config.swa_page_size),
                            std::to_string(swa_cache.page_size()));
  }
  std::vector<GatherJob> compressed_jobs, window_jobs;
  std::int64_t need_compressed = 0;
  for (std::int64_t r = chunk.req_begin; r < chunk.req_end; ++r) {
    const std::int64_t s = at1<const std::int32_t>(batch.seq_lens, r);
    const std::int64_t q = at1<const std::int32_t>(batch.query_lens, r);
    const std::int64_t b = r - chunk.req_begin;
    window_jobs.push_back(
        {s, detail::prefill_gather_len(s, q, config.window), detail::table_row(batch.swa_block_table, r), b});
    if (*type != LayerType::kSwaOnly) {
      const TensorView& table = *type == LayerType::kC4A ? batch.c4_block_table : batch.c128_block_table;
      if (!table.present()) {
        return invalid_argument(*type == LayerType::kC4A ? "batch.c4_block_table" : "batch.c128_block_table",
                                "present for a compressed layer", "absent");
      }
      need_compressed = std::max(need_compressed, s / compress_ratio);
      compressed_jobs.push_back({s / compress_ratio, s / compress_ratio, detail::table_row(table, r), b});
    }
  }
  if (compressed_rows < need_compressed) {
    return out_of_range("compressed_rows", fmt::format(">= {} (largest seq_len // r of the chunk)", need_compressed),
                        std::to_string(compressed_rows));
  }
  if (*type != LayerType::kSwaOnly) {
    const std::int64_t block = compressed_block_size(config, compress_ratio);
    if (compressed_cache.page_size() != block) {
      return invalid_argument("compressed_cache", fmt::format("page size 256 / r = {}", block),
                              std::to_string(compressed_cache.page_size()));
    }
    // Validate the window gather too before the first write, so an error leaves `out` untouched.
    SMLA_RETURN_IF_ERROR(validate_gather(swa_cache, window_jobs, compressed_rows, out, "batch.swa_block_table")
                             .with_context("swa_cache: "));
    SMLA_RETURN_IF_ERROR(gather_jobs(compressed_cache, compressed_jobs, 0, out, "compressed block table"));
  }
  return gather_jobs(swa_cache, window_jobs, compressed_rows, out, "batch.swa_block_table");
}

}  // namespace smla
