// The cuda row of Op::kStepMetadata (the Context forms of smla/metadata.h on a
// cuda context): host-side checks of shapes, dtypes and devices (never of
// values), params from the views, launch on the context's stream. No
// allocation and no synchronization.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "smla/metadata.h"
#include "src/core/argument_checks.h"
#include "src/core/metadata/metadata_functions.h"
#include "src/core/metadata/metadata_rules.h"
#include "src/cuda/common/current_device.h"
#include "src/cuda/metadata/metadata_params.h"
#include "src/runtime/registry_internal.h"

namespace smla {
namespace {

using cuda::DeviceBatch;
using cuda::DeviceTable;

// Every device view of one call must sit on one device, the context's. The
// device is asked last, so shape errors are reported without a GPU.
class DeviceChecker {
 public:
  Status check(const TensorView& view, std::string_view name, DType dtype, int rank) {
    SMLA_RETURN_IF_ERROR(detail::check_strided_tensor(view, name, dtype, rank, DeviceKind::kCuda));
    if (device_ < 0) {
      device_ = view.device.index;
      first_ = std::string(name);
    } else if (view.device.index != device_) {
      return invalid_argument(name, fmt::format("cuda:{} (the device of {})", device_, first_),
                              fmt::format("cuda:{}", view.device.index));
    }
    return Status::Ok();
  }
  Status check_optional(const TensorView& view, std::string_view name, DType dtype, int rank) {
    return view.present() ? check(view, name, dtype, rank) : Status::Ok();
  }
  // The last check before a launch: the views sit on the context's device, and
  // the context runs kernels (a validating one stops here).
  Status check_launchable(const Context& context) const {
    if (device_ >= 0) SMLA_RETURN_IF_ERROR(cuda::check_on_context_device(context, device_, first_));
    return runtime::check_runs(context);
  }

 private:
  int device_ = -1;
  std::string first_;
};

Status check_vector(DeviceChecker& dev, const TensorView& v, std::string_view name, DType dtype, std::int64_t rows) {
  SMLA_RETURN_IF_ERROR(dev.check(v, name, dtype, 1));
  return detail::check_min_extent(v, name, 0, rows);
}

Status check_matrix(DeviceChecker& dev, const TensorView& v, std::string_view name, std::int64_t rows,
                    std::int64_t width) {
  SMLA_RETURN_IF_ERROR(dev.check(v, name, DType::kI32, 2));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(v, name, 0, rows));
  return detail::check_extent(v, name, 1, width);
}

Status check_absent(const TensorView& v, std::string_view name, std::string_view table) {
  if (v.present()) return invalid_argument(name, fmt::format("absent (batch.{} is absent)", table), v.describe());
  return Status::Ok();
}

Status check_block_size(std::int64_t block_size) {
  if (block_size < 1 || block_size > (1 << 20)) {
    return invalid_argument("block_size", "a value in [1, 2^20]", std::to_string(block_size));
  }
  return Status::Ok();
}

DeviceTable device_table(const TensorView& t) {
  if (!t.present()) return {};
  return {static_cast<const std::int32_t*>(t.data), t.stride[0], t.stride[1], t.shape[0], t.shape[1]};
}

Status check_table(DeviceChecker& dev, const TensorView& t, std::string_view name, std::int64_t rows) {
  SMLA_RETURN_IF_ERROR(dev.check(t, name, DType::kI32, 2));
  return detail::check_min_extent(t, name, 0, rows);
}

// query_lens, seq_lens and the tables of a batch (num_tokens and token_valid not read).
Expected<DeviceBatch> device_requests(DeviceChecker& dev, const BatchDescription& batch, const StepConfig& config) {
  SMLA_RETURN_IF_ERROR(validate_step_config(config));
  SMLA_RETURN_IF_ERROR(dev.check(batch.query_lens, "batch.query_lens", DType::kI32, 1));
  const std::int64_t reqs = batch.query_lens.shape[0];
  if (reqs > (std::int64_t{1} << 30)) {  // one launch covers the rows and one block per request
    return out_of_range("batch.query_lens", "at most 2^30 requests", batch.query_lens.shape_string());
  }
  SMLA_RETURN_IF_ERROR(dev.check(batch.seq_lens, "batch.seq_lens", DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(detail::check_extent(batch.seq_lens, "batch.seq_lens", 0, reqs));
  SMLA_RETURN_IF_ERROR(check_table(dev, batch.swa_block_table, "batch.swa_block_table", reqs));
  if (batch.c4_block_table.present()) {
    SMLA_RETURN_IF_ERROR(check_table(dev, batch.c4_block_table, "batch.c4_block_table", reqs));
  }
  if (batch.c128_block_table.present()) {
    SMLA_RETURN_IF_ERROR(check_table(dev, batch.c128_block_table, "batch.c128_block_table", reqs));
  }
  DeviceBatch b;
  b.query_lens = static_cast<const std::int32_t*>(batch.query_lens.data);
  b.query_lens_stride = batch.query_lens.stride[0];
  b.seq_lens = static_cast<const std::int32_t*>(batch.seq_lens.data);
  b.seq_lens_stride = batch.seq_lens.stride[0];
  b.num_reqs = reqs;
  b.swa = device_table(batch.swa_block_table);
  b.c4 = device_table(batch.c4_block_table);
  b.c128 = device_table(batch.c128_block_table);
  return b;
}

// device_requests plus the token capacity T = batch.num_tokens and token_valid [T].
Expected<DeviceBatch> device_batch(DeviceChecker& dev, const BatchDescription& batch, const StepConfig& config) {
  Expected<DeviceBatch> b = device_requests(dev, batch, config);
  if (!b) return b.status();
  if (batch.num_tokens < 0 || batch.num_tokens > config.max_num_batched_tokens) {
    return out_of_range("batch.num_tokens",
                        fmt::format("the token capacity T in [0, config.max_num_batched_tokens = {}] (the device "
                                    "API needs it explicitly: -1 would need the values on the host)",
                                    config.max_num_batched_tokens),
                        std::to_string(batch.num_tokens));
  }
  SMLA_RETURN_IF_ERROR(dev.check_optional(batch.token_valid, "batch.token_valid", DType::kU8, 1));
  if (batch.token_valid.present()) {
    SMLA_RETURN_IF_ERROR(detail::check_extent(batch.token_valid, "batch.token_valid", 0, batch.num_tokens));
    b->token_valid = static_cast<const std::uint8_t*>(batch.token_valid.data);
    b->token_valid_stride = batch.token_valid.stride[0];
  }
  b->num_tokens = batch.num_tokens;
  return b;
}

// The shape-level rules of a chunk: a non-empty request range inside the batch, ordered tokens.
Status check_chunk_shape(const PrefillChunk& chunk, std::int64_t reqs) {
  if (chunk.req_begin < 0 || chunk.req_begin >= chunk.req_end || chunk.req_end > reqs ||
      chunk.token_end < chunk.token_begin) {
    return out_of_range("chunk",
                        fmt::format("a non-empty request range inside [0, {}) and token_begin <= token_end", reqs),
                        fmt::format("requests [{}, {}), tokens [{}, {})", chunk.req_begin, chunk.req_end,
                                    chunk.token_begin, chunk.token_end));
  }
  return Status::Ok();
}

template <class T>
T* data_of(const TensorView& v) {
  return static_cast<T*>(v.data);
}

// A params struct's (pointer, stride) pair of a vector; an absent view leaves them unset.
template <class T>
void bind_vector(const TensorView& v, T** data, std::int64_t* stride) {
  if (!v.present()) return;
  *data = data_of<T>(v);
  *stride = v.stride[0];
}

// A params struct's (pointer, row stride, column stride) of a matrix.
template <class T>
void bind_matrix(const TensorView& v, T** data, std::int64_t* stride_rows, std::int64_t* stride_cols) {
  *data = data_of<T>(v);
  *stride_rows = v.stride[0];
  *stride_cols = v.stride[1];
}

Status launched(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess) {
    return internal_error(fmt::format("{}: kernel launch failed: {}", what, cudaGetErrorString(error)));
  }
  return Status::Ok();
}

Status check_step_buffers(DeviceChecker& dev, const BatchDescription& batch, const StepConfig& config,
                          const StepMetadataBuffers& o, const TensorView& counts) {
  const std::int64_t reqs = batch.query_lens.shape[0];
  const std::int64_t t = batch.num_tokens;
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.query_start_loc, "out.query_start_loc", DType::kI32, reqs + 1));
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.token_to_req, "out.token_to_req", DType::kI32, t));
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.positions, "out.positions", DType::kI64, t));
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.is_valid_token, "out.is_valid_token", DType::kU8, t));
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.swa_slot_mapping, "out.swa_slot_mapping", DType::kI64, t));
  SMLA_RETURN_IF_ERROR(check_matrix(dev, o.swa_indices, "out.swa_indices", t, config.window));
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.swa_lens, "out.swa_lens", DType::kI32, t));
  SMLA_RETURN_IF_ERROR(check_vector(dev, o.prefill_gather_lens, "out.prefill_gather_lens", DType::kI32, reqs));
  if (batch.c4_block_table.present()) {
    SMLA_RETURN_IF_ERROR(check_vector(dev, o.c4_slot_mapping, "out.c4_slot_mapping", DType::kI64, t));
  } else {
    SMLA_RETURN_IF_ERROR(check_absent(o.c4_slot_mapping, "out.c4_slot_mapping", "c4_block_table"));
  }
  if (batch.c128_block_table.present()) {
    const std::int64_t width = c128a_width(config);
    SMLA_RETURN_IF_ERROR(check_vector(dev, o.c128_slot_mapping, "out.c128_slot_mapping", DType::kI64, t));
    SMLA_RETURN_IF_ERROR(check_matrix(dev, o.c128a_decode_indices, "out.c128a_decode_indices", t, width));
    SMLA_RETURN_IF_ERROR(check_vector(dev, o.c128a_decode_lens, "out.c128a_decode_lens", DType::kI32, t));
    SMLA_RETURN_IF_ERROR(check_matrix(dev, o.c128a_prefill_indices, "out.c128a_prefill_indices", t, width));
  } else {
    SMLA_RETURN_IF_ERROR(check_absent(o.c128_slot_mapping, "out.c128_slot_mapping", "c128_block_table"));
    SMLA_RETURN_IF_ERROR(check_absent(o.c128a_decode_indices, "out.c128a_decode_indices", "c128_block_table"));
    SMLA_RETURN_IF_ERROR(check_absent(o.c128a_decode_lens, "out.c128a_decode_lens", "c128_block_table"));
    SMLA_RETURN_IF_ERROR(check_absent(o.c128a_prefill_indices, "out.c128a_prefill_indices", "c128_block_table"));
  }
  return check_vector(dev, counts, "counts", DType::kI64, kStepCountFields);
}

}  // namespace

namespace metadata_cuda {
namespace {

Status build_step_metadata(const Context& context, const BatchDescription& batch, const StepConfig& config,
                                const StepMetadataBuffers& out, const TensorView& counts) {
  DeviceChecker dev;
  Expected<DeviceBatch> b = device_batch(dev, batch, config);
  if (!b) return b.status().with_context("build_step_metadata: ");
  SMLA_RETURN_IF_ERROR(check_step_buffers(dev, batch, config, out, counts).with_context("build_step_metadata: "));
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  cuda::StepMetadataParams p;
  p.batch = *b;
  p.window = config.window;
  p.max_model_len = config.max_model_len;
  p.decode_threshold = config.decode_threshold();
  p.swa_page = config.swa_page_size;
  p.c4_block = compressed_block_size(config, 4);
  p.c128_block = compressed_block_size(config, 128);
  p.c128_width = c128a_width(config);
  p.c128_active = config.c128a_active_width > 0 ? config.c128a_active_width : p.c128_width;
  bind_vector(out.query_start_loc, &p.query_start_loc, &p.stride_query_start_loc);
  bind_vector(out.token_to_req, &p.token_to_req, &p.stride_token_to_req);
  bind_vector(out.positions, &p.positions, &p.stride_positions);
  bind_vector(out.is_valid_token, &p.is_valid_token, &p.stride_is_valid_token);
  bind_vector(out.swa_slot_mapping, &p.swa_slot_mapping, &p.stride_swa_slot_mapping);
  bind_matrix(out.swa_indices, &p.swa_indices, &p.stride_swa_indices_t, &p.stride_swa_indices_c);
  bind_vector(out.swa_lens, &p.swa_lens, &p.stride_swa_lens);
  bind_vector(out.prefill_gather_lens, &p.prefill_gather_lens, &p.stride_prefill_gather_lens);
  if (batch.c4_block_table.present()) bind_vector(out.c4_slot_mapping, &p.c4_slot_mapping, &p.stride_c4_slot_mapping);
  if (batch.c128_block_table.present()) {
    bind_vector(out.c128_slot_mapping, &p.c128_slot_mapping, &p.stride_c128_slot_mapping);
    bind_matrix(out.c128a_decode_indices, &p.c128a_decode_indices, &p.stride_c128a_decode_t, &p.stride_c128a_decode_c);
    bind_vector(out.c128a_decode_lens, &p.c128a_decode_lens, &p.stride_c128a_decode_lens);
    bind_matrix(out.c128a_prefill_indices, &p.c128a_prefill_indices, &p.stride_c128a_prefill_t,
                &p.stride_c128a_prefill_c);
  }
  p.counts = data_of<std::int64_t>(counts);
  p.stride_counts = counts.stride[0];
  return launched(cuda::launch_step_metadata(p, static_cast<cudaStream_t>(context.stream())), "build_step_metadata");
}

Status c4a_global_topk_indices(const Context& context, const TensorView& local_topk, const TensorView& token_to_req,
                                    const TensorView& is_valid_token, const TensorView& block_table,
                                    std::int64_t block_size, const TensorView& global_out, const TensorView& lens_out) {
  DeviceChecker dev;
  SMLA_RETURN_IF_ERROR(check_block_size(block_size));
  SMLA_RETURN_IF_ERROR(dev.check(local_topk, "local_topk", DType::kI32, 2));
  const std::int64_t n = local_topk.shape[0];
  const std::int64_t k = local_topk.shape[1];
  SMLA_RETURN_IF_ERROR(dev.check(token_to_req, "token_to_req", DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(detail::check_extent(token_to_req, "token_to_req", 0, n));
  SMLA_RETURN_IF_ERROR(dev.check_optional(is_valid_token, "is_valid_token", DType::kU8, 1));
  if (is_valid_token.present()) SMLA_RETURN_IF_ERROR(detail::check_extent(is_valid_token, "is_valid_token", 0, n));
  SMLA_RETURN_IF_ERROR(check_table(dev, block_table, "block_table", 0));
  SMLA_RETURN_IF_ERROR(check_matrix(dev, global_out, "global_out", n, k));
  SMLA_RETURN_IF_ERROR(check_vector(dev, lens_out, "lens_out", DType::kI32, n));
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  cuda::C4aGlobalParams p;
  bind_matrix(local_topk, &p.local, &p.stride_local_t, &p.stride_local_k);
  bind_vector(token_to_req, &p.token_to_req, &p.stride_token_to_req);
  bind_vector(is_valid_token, &p.is_valid_token, &p.stride_is_valid_token);
  p.table = device_table(block_table);
  p.block_size = block_size;
  bind_matrix(global_out, &p.out, &p.stride_out_t, &p.stride_out_k);
  bind_vector(lens_out, &p.lens, &p.stride_lens);
  p.num_rows = n;
  p.topk = k;
  return launched(cuda::launch_c4a_global(p, static_cast<cudaStream_t>(context.stream())), "c4a_global_topk_indices");
}

Status v32_request_to_global_indices(const Context& context, const TensorView& req_indices, const TensorView& req_id,
                                          const TensorView& block_table, std::int64_t block_size,
                                          std::int64_t block_stride_rows, const TensorView& out,
                                          const TensorView& valid_counts) {
  DeviceChecker dev;
  SMLA_RETURN_IF_ERROR(check_block_size(block_size));
  const std::int64_t stride_rows = block_stride_rows > 0 ? block_stride_rows : block_size;
  if (stride_rows < block_size || stride_rows > (1 << 20)) {
    return invalid_argument("block_stride_rows", fmt::format("<= 0 or a value in [block_size = {}, 2^20]", block_size),
                            std::to_string(block_stride_rows));
  }
  SMLA_RETURN_IF_ERROR(dev.check(req_indices, "req_indices", DType::kI32, 2));
  const std::int64_t n = req_indices.shape[0];
  const std::int64_t k = req_indices.shape[1];
  SMLA_RETURN_IF_ERROR(dev.check(req_id, "req_id", DType::kI32, 1));
  SMLA_RETURN_IF_ERROR(detail::check_extent(req_id, "req_id", 0, n));
  SMLA_RETURN_IF_ERROR(check_table(dev, block_table, "block_table", 0));
  SMLA_RETURN_IF_ERROR(check_matrix(dev, out, "out", n, k));
  if (valid_counts.present()) SMLA_RETURN_IF_ERROR(check_vector(dev, valid_counts, "valid_counts", DType::kI32, n));
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  cuda::V32GlobalParams p;
  p.req_indices = data_of<const std::int32_t>(req_indices);
  p.stride_in_t = req_indices.stride[0];
  p.stride_in_k = req_indices.stride[1];
  p.req_id = data_of<const std::int32_t>(req_id);
  p.stride_req_id = req_id.stride[0];
  p.table = device_table(block_table);
  p.block_size = block_size;
  p.block_stride_rows = stride_rows;
  p.out = data_of<std::int32_t>(out);
  p.stride_out_t = out.stride[0];
  p.stride_out_k = out.stride[1];
  if (valid_counts.present()) {
    p.valid_counts = data_of<std::int32_t>(valid_counts);
    p.stride_valid_counts = valid_counts.stride[0];
  }
  p.num_rows = n;
  p.topk = k;
  return launched(cuda::launch_v32_global(p, static_cast<cudaStream_t>(context.stream())),
                  "v32_request_to_global_indices");
}

Status mixed_sparse_indices(const Context& context, const BatchDescription& batch, const StepConfig& config,
                            int compress_ratio, const TensorView& c4a_local_topk, const TensorView& out_indices,
                            const TensorView& out_lens) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  DeviceChecker dev;
  Expected<DeviceBatch> b = device_batch(dev, batch, config);
  if (!b) return b.status().with_context("mixed_sparse_indices: ");
  const std::int64_t tokens = batch.num_tokens;
  const std::int64_t topk_width = compressed_topk_width(config, *type);
  const std::int64_t packed_topk = detail::roundup(topk_width, 4);
  const std::int64_t width = config.window + packed_topk;
  cuda::MixedIndicesParams p;
  if (*type == LayerType::kC4A) {
    if (!batch.c4_block_table.present()) {
      return invalid_argument("batch.c4_block_table", "present for a C4A layer", "absent");
    }
    p.group = b->c4;
    SMLA_RETURN_IF_ERROR(check_matrix(dev, c4a_local_topk, "c4a_local_topk", tokens, topk_width));
    p.local_topk = data_of<const std::int32_t>(c4a_local_topk);
    p.stride_local_t = c4a_local_topk.stride[0];
    p.stride_local_k = c4a_local_topk.stride[1];
  } else {
    if (c4a_local_topk.present()) {
      return invalid_argument("c4a_local_topk", "absent unless the layer is C4A", c4a_local_topk.describe());
    }
    if (*type == LayerType::kC128A) {
      if (!batch.c128_block_table.present()) {
        return invalid_argument("batch.c128_block_table", "present for a C128A layer", "absent");
      }
      p.group = b->c128;
    }
  }
  SMLA_RETURN_IF_ERROR(check_matrix(dev, out_indices, "out_indices", tokens, width));
  if (out_indices.stride[0] % 4 != 0 || out_indices.stride[1] != 1) {
    return invalid_argument("out_indices", "contiguous rows whose stride is a multiple of 4 elements (16 bytes)",
                            out_indices.describe());
  }
  SMLA_RETURN_IF_ERROR(check_vector(dev, out_lens, "out_lens", DType::kI32, tokens));
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  p.batch = *b;
  p.window = config.window;
  p.swa_page = config.swa_page_size;
  p.ratio = compress_ratio;
  p.group_block = compress_ratio > 1 ? compressed_block_size(config, compress_ratio) : 1;
  p.topk_width = topk_width;
  p.packed_topk = packed_topk;
  p.c128_active = config.c128a_active_width > 0 ? config.c128a_active_width : topk_width;
  p.out = data_of<std::int32_t>(out_indices);
  p.stride_out_t = out_indices.stride[0];
  p.lens = data_of<std::int32_t>(out_lens);
  p.stride_lens = out_lens.stride[0];
  return launched(cuda::launch_mixed_indices(p, static_cast<cudaStream_t>(context.stream())), "mixed_sparse_indices");
}

Status dequantize_and_gather(const Context& context, const KvCacheView& cache, const TensorView& seq_lens,
                                  const TensorView& gather_lens, const TensorView& block_table, std::int64_t offset,
                                  const TensorView& out) {
  DeviceChecker dev;
  SMLA_RETURN_IF_ERROR(dev.check(seq_lens, "seq_lens", DType::kI32, 1));
  const std::int64_t batch = seq_lens.shape[0];
  SMLA_RETURN_IF_ERROR(dev.check_optional(gather_lens, "gather_lens", DType::kI32, 1));
  if (gather_lens.present()) SMLA_RETURN_IF_ERROR(detail::check_extent(gather_lens, "gather_lens", 0, batch));
  SMLA_RETURN_IF_ERROR(check_table(dev, block_table, "block_table", batch));
  SMLA_RETURN_IF_ERROR(validate_kv_cache(cache, "cache"));
  SMLA_RETURN_IF_ERROR(dev.check(cache.pages, "cache.pages", cache.pages.dtype, 3));
  SMLA_RETURN_IF_ERROR(dev.check(out, "out", DType::kBF16, 3));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(out, "out", 0, batch));
  SMLA_RETURN_IF_ERROR(detail::check_extent(out, "out", 2, kv_format_info(cache.format).head_dim));
  if (offset < 0 || offset > out.shape[1]) {
    return out_of_range("offset", fmt::format("a value in [0, out rows = {}]", out.shape[1]), std::to_string(offset));
  }
  const int rows_per_block = cuda::gather_rows_per_block(kv_format_info(cache.format).head_dim);
  const std::int64_t row_blocks = detail::cdiv(out.shape[1] - offset, rows_per_block);
  if (batch * row_blocks > detail::kMaxI32) {
    return out_of_range("out", fmt::format("batch * cdiv(rows - offset, {}) <= 2^31 - 1 (one launch)", rows_per_block),
                        out.shape_string());
  }
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  cuda::GatherParams p;
  p.pages = static_cast<const std::uint8_t*>(cache.pages.data);
  p.page_stride_bytes = cache.page_stride_bytes();
  p.page_size = cache.page_size();
  p.num_pages = cache.num_pages();
  p.fp8_scale = cache.fp8_scale;
  bind_vector(seq_lens, &p.seq_lens, &p.stride_seq_lens);
  bind_vector(gather_lens, &p.gather_lens, &p.stride_gather_lens);
  p.table = device_table(block_table);
  p.offset = offset;
  p.out = data_of<std::uint16_t>(out);
  p.stride_out_b = out.stride[0];
  p.stride_out_m = out.stride[1];
  p.stride_out_d = out.stride[2];
  p.out_rows = out.shape[1];
  p.batch = batch;
  return launched(cuda::launch_dequantize_gather(cache.format, p, static_cast<cudaStream_t>(context.stream())),
                  "dequantize_and_gather");
}

Status combine_topk_swa_indices(const Context& context, const BatchDescription& batch, const StepConfig& config,
                                int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                                std::int64_t workspace_rows, const TensorView& topk, const TensorView& out_indices,
                                const TensorView& out_lens) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  DeviceChecker dev;
  Expected<DeviceBatch> b = device_requests(dev, batch, config);
  if (!b) return b.status().with_context("combine_topk_swa_indices: ");
  SMLA_RETURN_IF_ERROR(check_chunk_shape(chunk, b->num_reqs));
  const std::int64_t tokens = chunk.token_end - chunk.token_begin;
  const std::int64_t reqs = chunk.req_end - chunk.req_begin;
  if (compressed_rows < 0 || workspace_rows < compressed_rows || compressed_rows > detail::kMaxI32 ||
      workspace_rows > detail::kMaxI32 / reqs) {
    return out_of_range("compressed_rows/workspace_rows",
                        "0 <= compressed_rows <= workspace_rows and chunk requests * workspace_rows <= 2^31 - 1",
                        fmt::format("{} / {} for {} requests", compressed_rows, workspace_rows, reqs));
  }
  const std::int64_t topk_width = compressed_topk_width(config, *type);
  if (*type == LayerType::kSwaOnly) {
    if (topk.present()) return invalid_argument("topk", "absent for a SWA-only layer", topk.describe());
  } else {
    SMLA_RETURN_IF_ERROR(check_matrix(dev, topk, "topk", tokens, topk_width));
  }
  const std::int64_t width = combined_index_width(config, *type);
  SMLA_RETURN_IF_ERROR(check_matrix(dev, out_indices, "out_indices", tokens, width));
  SMLA_RETURN_IF_ERROR(check_vector(dev, out_lens, "out_lens", DType::kI32, tokens));
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  cuda::CombineParams p;
  p.batch = *b;
  p.req_begin = chunk.req_begin;
  p.req_end = chunk.req_end;
  p.rows = tokens;
  p.window = config.window;
  p.ratio = compress_ratio;
  if (topk.present()) {
    p.topk = data_of<const std::int32_t>(topk);
    p.stride_topk_t = topk.stride[0];
    p.stride_topk_k = topk.stride[1];
  }
  p.topk_width = topk_width;
  p.compressed_rows = compressed_rows;
  p.workspace_rows = workspace_rows;
  p.out = data_of<std::int32_t>(out_indices);
  p.stride_out_t = out_indices.stride[0];
  p.stride_out_c = out_indices.stride[1];
  p.width = width;
  p.lens = data_of<std::int32_t>(out_lens);
  p.stride_lens = out_lens.stride[0];
  return launched(cuda::launch_combine_indices(p, static_cast<cudaStream_t>(context.stream())),
                  "combine_topk_swa_indices");
}

// A compressed layer's source of gather_prefill_chunk: its block table (returned)
// and its cache, whose pages hold 256 / r entries of the swa cache's head dim.
Expected<const TensorView*> check_compressed_source(DeviceChecker& dev, const BatchDescription& batch,
                                                    const StepConfig& config, LayerType type, int compress_ratio,
                                                    const KvCacheView& compressed_cache, std::int64_t head_dim) {
  const bool c4a = type == LayerType::kC4A;
  const TensorView* table = c4a ? &batch.c4_block_table : &batch.c128_block_table;
  if (!table->present()) {
    return invalid_argument(c4a ? "batch.c4_block_table" : "batch.c128_block_table", "present for a compressed layer",
                            "absent");
  }
  SMLA_RETURN_IF_ERROR(validate_kv_cache(compressed_cache, "compressed_cache"));
  SMLA_RETURN_IF_ERROR(dev.check(compressed_cache.pages, "compressed_cache.pages", compressed_cache.pages.dtype, 3));
  const std::int64_t block = compressed_block_size(config, compress_ratio);
  if (compressed_cache.page_size() != block) {
    return invalid_argument("compressed_cache", fmt::format("page size 256 / r = {}", block),
                            std::to_string(compressed_cache.page_size()));
  }
  if (kv_format_info(compressed_cache.format).head_dim != head_dim) {
    return invalid_argument("compressed_cache", fmt::format("head dim {} (the swa cache's)", head_dim),
                            std::to_string(kv_format_info(compressed_cache.format).head_dim));
  }
  return table;
}

Status gather_prefill_chunk(const Context& context, const BatchDescription& batch, const StepConfig& config,
                            int compress_ratio, const PrefillChunk& chunk, std::int64_t compressed_rows,
                            const KvCacheView& swa_cache, const KvCacheView& compressed_cache, const TensorView& out) {
  Expected<LayerType> type = layer_type_for_ratio(compress_ratio);
  if (!type) return type.status();
  DeviceChecker dev;
  Expected<DeviceBatch> b = device_requests(dev, batch, config);
  if (!b) return b.status().with_context("gather_prefill_chunk: ");
  SMLA_RETURN_IF_ERROR(check_chunk_shape(chunk, b->num_reqs));
  const std::int64_t reqs = chunk.req_end - chunk.req_begin;
  SMLA_RETURN_IF_ERROR(validate_kv_cache(swa_cache, "swa_cache"));
  SMLA_RETURN_IF_ERROR(dev.check(swa_cache.pages, "swa_cache.pages", swa_cache.pages.dtype, 3));
  if (swa_cache.page_size() != config.swa_page_size) {
    return invalid_argument("swa_cache", fmt::format("page size config.swa_page_size = {}", config.swa_page_size),
                            std::to_string(swa_cache.page_size()));
  }
  const std::int64_t head_dim = kv_format_info(swa_cache.format).head_dim;
  SMLA_RETURN_IF_ERROR(dev.check(out, "out", DType::kBF16, 3));
  SMLA_RETURN_IF_ERROR(detail::check_min_extent(out, "out", 0, reqs));
  SMLA_RETURN_IF_ERROR(detail::check_extent(out, "out", 2, head_dim));
  if (compressed_rows < 0 || compressed_rows > out.shape[1]) {
    return out_of_range("compressed_rows", fmt::format("a value in [0, out rows = {}]", out.shape[1]),
                        std::to_string(compressed_rows));
  }
  const int rows_per_block = cuda::gather_rows_per_block(head_dim);
  if (reqs * detail::cdiv(out.shape[1], rows_per_block) > detail::kMaxI32) {
    return out_of_range("out", fmt::format("chunk requests * cdiv(rows, {}) <= 2^31 - 1 (one launch)", rows_per_block),
                        out.shape_string());
  }
  const TensorView* table = nullptr;
  if (*type != LayerType::kSwaOnly) {
    auto compressed_table =
        check_compressed_source(dev, batch, config, *type, compress_ratio, compressed_cache, head_dim);
    if (!compressed_table) return compressed_table.status();
    table = *compressed_table;
  }
  SMLA_RETURN_IF_ERROR(dev.check_launchable(context));

  // One request row per chunk request: views shifted to req_begin (no dereference here).
  auto shifted = [&](const TensorView& t) {
    DeviceTable d = device_table(t);
    d.data += chunk.req_begin * d.row_stride;
    d.rows = reqs;
    return d;
  };
  cuda::GatherParams p;
  p.seq_lens = b->seq_lens + chunk.req_begin * b->seq_lens_stride;
  p.stride_seq_lens = b->seq_lens_stride;
  p.out = data_of<std::uint16_t>(out);
  p.stride_out_b = out.stride[0];
  p.stride_out_m = out.stride[1];
  p.stride_out_d = out.stride[2];
  p.batch = reqs;
  auto set_cache = [&](const KvCacheView& cache) {
    p.pages = static_cast<const std::uint8_t*>(cache.pages.data);
    p.page_stride_bytes = cache.page_stride_bytes();
    p.page_size = cache.page_size();
    p.num_pages = cache.num_pages();
    p.fp8_scale = cache.fp8_scale;
  };
  const auto cuda_stream = static_cast<cudaStream_t>(context.stream());
  if (table != nullptr) {
    set_cache(compressed_cache);
    p.table = shifted(*table);
    p.seq_div = compress_ratio;
    p.offset = 0;
    p.out_rows = compressed_rows;  // entries past N would overwrite the window rows: clamped
    SMLA_RETURN_IF_ERROR(launched(cuda::launch_dequantize_gather(compressed_cache.format, p, cuda_stream),
                                  "gather_prefill_chunk"));
  }
  set_cache(swa_cache);
  p.table = shifted(batch.swa_block_table);
  p.seq_div = 1;
  p.query_lens = b->query_lens + chunk.req_begin * b->query_lens_stride;
  p.stride_query_lens = b->query_lens_stride;
  p.window = config.window;
  p.offset = compressed_rows;
  p.out_rows = out.shape[1];
  return launched(cuda::launch_dequantize_gather(swa_cache.format, p, cuda_stream), "gather_prefill_chunk");
}

}  // namespace

const metadata_detail::MetadataFunctions kFunctions{
    &build_step_metadata,   &c4a_global_topk_indices,  &v32_request_to_global_indices, &mixed_sparse_indices,
    &dequantize_and_gather, &combine_topk_swa_indices, &gather_prefill_chunk};

}  // namespace metadata_cuda
}  // namespace smla
