// Dequantize-and-gather on the device (spec 4.5): one thread per gathered row,
// decoding through the shared codec rule (src/core/kv_rows.h decode_token) so
// the bytes equal the host's.
#include <cuda_runtime.h>

#include <cstdint>

#include "src/core/kv_rows.h"
#include "src/cuda/metadata/metadata_device.cuh"
#include "src/cuda/metadata/metadata_params.h"

namespace smla::cuda {
namespace {

constexpr int kGatherThreads = kGatherRowsPerBlock;

template <class Format>
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(const __grid_constant__ GatherParams p,
                                                               std::int64_t row_blocks) {
  const std::int64_t b = static_cast<std::int64_t>(blockIdx.x) / row_blocks;
  const std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) % row_blocks) * kGatherThreads + threadIdx.x;
  const std::int64_t seq_len = load_i32(p.seq_lens, p.stride_seq_lens, b) / p.seq_div;
  std::int64_t gather = seq_len;
  if (p.gather_lens != nullptr) gather = load_i32(p.gather_lens, p.stride_gather_lens, b);
  if (p.query_lens != nullptr) {
    gather = detail::prefill_gather_len(seq_len, load_i32(p.query_lens, p.stride_query_lens, b), p.window);
  }
  gather = detail::min64(detail::max64(gather, 0), detail::max64(seq_len, 0));
  gather = detail::min64(gather, p.out_rows - p.offset);
  if (i >= gather) return;
  const std::int64_t pos = seq_len - gather + i;
  const detail::BlockTableRow row = device_table_row(p.table, b);
  const std::int64_t col = pos / p.page_size;
  std::int64_t block = -1;
  if (col < row.num_cols) block = row.data[col * row.col_stride];
  float values[Format::kHeadDim];
  if (block >= 0 && block < p.num_pages) {
    detail::decode_token<Format>(p.pages + block * p.page_stride_bytes, p.page_size, pos % p.page_size, p.fp8_scale,
                                 values);
  } else {
    for (int d = 0; d < Format::kHeadDim; ++d) values[d] = 0.0f;
  }
  std::uint16_t* dst = p.out + b * p.stride_out_b + (p.offset + i) * p.stride_out_m;
  for (int d = 0; d < Format::kHeadDim; ++d) dst[d * p.stride_out_d] = f32_to_bf16(values[d]);
}

template <class Format>
cudaError_t launch_format(const GatherParams& p, cudaStream_t stream) {
  const std::int64_t rows = p.out_rows - p.offset;
  if (p.batch <= 0 || rows <= 0) return cudaGetLastError();
  const std::int64_t row_blocks = detail::cdiv(rows, kGatherThreads);
  gather_kernel<Format><<<static_cast<unsigned>(p.batch * row_blocks), kGatherThreads, 0, stream>>>(p, row_blocks);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dequantize_gather(KvFormat format, const GatherParams& p, cudaStream_t stream) {
  return visit_kv_format(format, [&](auto traits) { return launch_format<decltype(traits)>(p, stream); });
}

}  // namespace smla::cuda
