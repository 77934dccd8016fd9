// Device-side fill of large synthetic benchmark inputs: random finite FP8
// cache pages in a format's exact byte layout, and random bf16 queries.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "smla/kv_format.h"

namespace smla::bench {

// Fills num_pages pages of page_size tokens (page_stride_bytes apart) with
// random finite rows: e4m3 codes (never NaN), scales 2^-8..2^-6, bf16 RoPE in
// (-2, 2), pad bytes 0. Supports the V4 and V3.2 FP8 formats.
cudaError_t fill_fp8_pages(KvFormat format, std::uint8_t* pages, std::int64_t num_pages, std::int64_t page_size,
                           std::int64_t page_stride_bytes, std::uint64_t seed, cudaStream_t stream);

// count random finite bf16 values in (-2, 2).
cudaError_t fill_bf16(std::uint16_t* data, std::int64_t count, std::uint64_t seed, cudaStream_t stream);

// Reads `bytes` (a multiple of 16) of `data`: an L2 flush that leaves clean lines, where
// a memset leaves dirty ones that later writes must first evict to DRAM.
cudaError_t read_through(const void* data, std::size_t bytes, cudaStream_t stream);

}  // namespace smla::bench
