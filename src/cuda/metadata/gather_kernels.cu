// Dequantize-and-gather on the device (spec 4.5): a thread per 8 values of a
// gathered row, decoding through the shared codec rule (src/core/kv_rows.h
// decode_unit) so the bytes equal the host's, stored as one 16-byte write where
// the output allows. A thread per row (a whole row decoded into a local array,
// then written a value at a time, each thread's stores 1 KB from its neighbour's)
// ran at about 32 GB/s (docs/PERF.md).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "src/core/kv_rows.h"
#include "src/cuda/metadata/metadata_device.cuh"
#include "src/cuda/metadata/metadata_params.h"

namespace smla::cuda {
namespace {

template <class Format>
struct GatherShape {
  static constexpr int kUnitsPerRow = Format::kHeadDim / detail::kDecodeUnit;
  static constexpr int kRowsPerBlock = gather_rows_per_block(Format::kHeadDim);
  static constexpr int kThreads = kRowsPerBlock * kUnitsPerRow;
};

// Block (b, row block): threadIdx.x = row in the block * units + unit.
template <class Format>
__global__ void __launch_bounds__(GatherShape<Format>::kThreads) gather_kernel(const __grid_constant__ GatherParams p,
                                                                               std::int64_t row_blocks) {
  using Shape = GatherShape<Format>;
  const std::int64_t b = static_cast<std::int64_t>(blockIdx.x) / row_blocks;
  const int unit = static_cast<int>(threadIdx.x) % Shape::kUnitsPerRow;
  const std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) % row_blocks) * Shape::kRowsPerBlock +
                         static_cast<int>(threadIdx.x) / Shape::kUnitsPerRow;
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
  float values[detail::kDecodeUnit];
  if (block >= 0 && block < p.num_pages) {
    detail::decode_unit<Format>(p.pages + block * p.page_stride_bytes, p.page_size, pos % p.page_size, p.fp8_scale,
                                unit, values);
  } else {
    for (int d = 0; d < detail::kDecodeUnit; ++d) values[d] = 0.0f;
  }
  std::uint16_t bits[detail::kDecodeUnit];
  for (int d = 0; d < detail::kDecodeUnit; ++d) bits[d] = f32_to_bf16(values[d]);
  std::uint16_t* dst = p.out + b * p.stride_out_b + (p.offset + i) * p.stride_out_m + unit * detail::kDecodeUnit * p.stride_out_d;
  if (p.stride_out_d == 1 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0) {
    uint4 packed;
    std::memcpy(&packed, bits, sizeof(packed));
    *reinterpret_cast<uint4*>(dst) = packed;
  } else {
    for (int d = 0; d < detail::kDecodeUnit; ++d) dst[d * p.stride_out_d] = bits[d];
  }
}

template <class Format>
cudaError_t launch_format(const GatherParams& p, cudaStream_t stream) {
  using Shape = GatherShape<Format>;
  const std::int64_t rows = p.out_rows - p.offset;
  if (p.batch <= 0 || rows <= 0) return cudaGetLastError();
  const std::int64_t row_blocks = detail::cdiv(rows, Shape::kRowsPerBlock);
  gather_kernel<Format><<<static_cast<unsigned>(p.batch * row_blocks), Shape::kThreads, 0, stream>>>(p, row_blocks);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dequantize_gather(KvFormat format, const GatherParams& p, cudaStream_t stream) {
  return visit_kv_format(format, [&](auto traits) { return launch_format<decltype(traits)>(p, stream); });
}

}  // namespace smla::cuda
