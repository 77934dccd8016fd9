#include "bench/cuda/synthetic_fill.h"

namespace smla::bench {
namespace {

__device__ __forceinline__ std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__device__ __forceinline__ std::uint8_t finite_e4m3(std::uint32_t h) {
  const std::uint8_t code = static_cast<std::uint8_t>(h);
  return (code & 0x7Fu) == 0x7Fu ? static_cast<std::uint8_t>(code ^ 1u) : code;  // 0x7F/0xFF are NaN
}

// bf16 bytes of a value in (-2, 2): exponent 0x7E or 0x7F, random mantissa and sign.
__device__ __forceinline__ std::uint8_t bf16_byte(std::uint32_t h, bool high) {
  if (!high) return static_cast<std::uint8_t>(h);
  return static_cast<std::uint8_t>(((h >> 8) & 0x80u) | 0x3Fu);
}

template <class Format>
__global__ void fill_pages_kernel(std::uint8_t* pages, std::int64_t total_bytes, std::int64_t page_size,
                                  std::int64_t page_stride, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total_bytes;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = mix(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(i));
    const std::int64_t offset = i % page_stride;
    std::uint8_t value = 0;
    if constexpr (Format::kFormat == KvFormat::kV4Fp8) {
      if (offset < page_size * Format::kDataBytes) {
        const std::int64_t r = offset % Format::kDataBytes;
        value = r < Format::kNopeDim ? finite_e4m3(h) : bf16_byte(h, (r - Format::kNopeDim) % 2 == 1);
      } else if (offset < page_size * Format::kBytesPerToken) {
        const std::int64_t r = (offset - page_size * Format::kDataBytes) % Format::kScaleBytes;
        value = r < Format::kNumTiles ? static_cast<std::uint8_t>(119 + h % 3) : 0;
      }
    } else {
      if (offset < page_size * Format::kBytesPerToken) {
        const std::int64_t r = offset % Format::kBytesPerToken;
        const std::int64_t scale_at = Format::scale_offset(0, 0);
        const std::int64_t rope_at = Format::rope_offset(0, 0);
        if (r < scale_at) {
          value = finite_e4m3(h);
        } else if (r < rope_at) {
          value = (r - scale_at) % 4 == 3 ? 0x3B : 0;  // f32 2^-9, little endian
        } else {
          value = bf16_byte(h, (r - rope_at) % 2 == 1);
        }
      }
    }
    pages[i] = value;
  }
}

__global__ void fill_bf16_kernel(std::uint16_t* data, std::int64_t count, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = mix(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(i));
    data[i] = static_cast<std::uint16_t>((h & 0x807Fu) | 0x3F00u);
  }
}

__global__ void read_through_kernel(const uint4* data, std::int64_t count) {
  unsigned folded = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = data[i];
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  asm volatile("" ::"r"(folded));  // keeps the loads
}

}  // namespace

cudaError_t read_through(const void* data, std::size_t bytes, cudaStream_t stream) {
  read_through_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(data), static_cast<std::int64_t>(bytes / 16));
  return cudaGetLastError();
}

cudaError_t fill_fp8_pages(KvFormat format, std::uint8_t* pages, std::int64_t num_pages, std::int64_t page_size,
                           std::int64_t page_stride_bytes, std::uint64_t seed, cudaStream_t stream) {
  const std::int64_t total = num_pages * page_stride_bytes;
  const unsigned blocks = 4096;
  if (format == KvFormat::kV4Fp8) {
    fill_pages_kernel<V4Fp8Format><<<blocks, 256, 0, stream>>>(pages, total, page_size, page_stride_bytes, seed);
  } else if (format == KvFormat::kV32Fp8) {
    fill_pages_kernel<V32Fp8Format><<<blocks, 256, 0, stream>>>(pages, total, page_size, page_stride_bytes, seed);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t fill_bf16(std::uint16_t* data, std::int64_t count, std::uint64_t seed, cudaStream_t stream) {
  fill_bf16_kernel<<<1024, 256, 0, stream>>>(data, count, seed);
  return cudaGetLastError();
}

}  // namespace smla::bench
