// Internal: host side of the CUDA layer ops (smla/cuda_layer.h): the plain
// parameter pieces the kernels receive by value, built from validated views,
// and the metadata-only checks of device tensors. No value in device memory is
// ever read here. Usable from .cu and .cc files (no device code).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "smla/indexer_cache.h"
#include "smla/kv_format.h"
#include "smla/rope.h"
#include "smla/status.h"
#include "smla/tensor.h"
#include "src/cuda/current_device.h"
#include "src/layer/cache_rows.h"

namespace smla::layer_cuda {

// The rotary table by value: angle = double(position) * inv_freq[p], cos/sin
// rounded to f32 once (how RopeTable builds its rows). sign = -1 rotates back.
struct RopeFrequencies {
  double inv_freq[kRopePairs];
  std::int64_t max_positions;
  float sign;
};

inline RopeFrequencies rope_frequencies(const RopeTable& table, RopeDirection direction) {
  RopeFrequencies f{};
  for (int p = 0; p < kRopePairs; ++p) f.inv_freq[p] = table.inverse_frequencies()[static_cast<std::size_t>(p)];
  f.max_positions = table.max_positions();
  f.sign = direction == RopeDirection::kForward ? 1.0f : -1.0f;
  return f;
}

// A rank-1 i32/i64 vector on the device (checked by check_index_vector).
struct IndexVectorRef {
  const void* data = nullptr;
  std::int64_t stride = 0;
  bool is_i64 = false;
};

inline IndexVectorRef index_vector(const TensorView& v) {
  return IndexVectorRef{v.data, v.stride[0], v.dtype == DType::kI64};
}

// A paged cache addressed by slot: page = slot / page_size, entry = slot % page_size.
struct PagedCacheRef {
  std::uint8_t* pages = nullptr;
  std::int64_t page_stride_bytes = 0;  // from the tensor's stride[0], never recomputed
  std::int64_t page_size = 1;
  std::int64_t num_slots = 0;
  float fp8_scale = 1.0f;  // fp8-rows only
};

inline PagedCacheRef paged_cache(const KvCacheView& cache) {
  return PagedCacheRef{static_cast<std::uint8_t*>(cache.pages.data), cache.page_stride_bytes(), cache.page_size(),
                       cache.num_slots(), cache.fp8_scale};
}

inline PagedCacheRef paged_cache(const IndexerCacheView& cache) {
  return PagedCacheRef{static_cast<std::uint8_t*>(cache.pages.data), cache.pages.stride[0], cache.page_size(),
                       cache.num_slots(), 1.0f};
}

// Same tensor metadata with the device kind swapped, so the host validators
// (which only look at shapes, strides and dtypes) can check a device tensor.
inline TensorView as_cpu_metadata(TensorView view) {
  view.device = Device{};
  return view;
}

// A tensor that must live on the CUDA device (present tensors only).
inline Status check_cuda_tensor(const TensorView& t, std::string_view name) {
  if (t.present() && t.device.kind != DeviceKind::kCuda) {
    return invalid_argument(name, "a cuda tensor", t.describe());
  }
  return Status::Ok();
}

// validate_row_cache_512 (rank, dtype, row size, page stride, 512-dim format) for a cuda cache.
inline Status check_row_cache_512(const KvCacheView& cache, std::string_view name) {
  SMLA_RETURN_IF_ERROR(check_cuda_tensor(cache.pages, name));
  KvCacheView metadata = cache;
  metadata.pages = as_cpu_metadata(cache.pages);
  return layer_detail::validate_row_cache_512(metadata, name);
}

// validate_indexer_cache for a cuda cache.
inline Status check_indexer_cache(const IndexerCacheView& cache, std::string_view name) {
  SMLA_RETURN_IF_ERROR(check_cuda_tensor(cache.pages, name));
  IndexerCacheView metadata = cache;
  metadata.pages = as_cpu_metadata(cache.pages);
  return validate_indexer_cache(metadata, name);
}

// Every present tensor on the current device (its index), checked after the
// shape checks so device-free callers see the argument errors first.
using ::smla::cuda::check_on_current_device;

// The launch error of the kernels just queued on the stream (no synchronization).
inline Status launch_status(std::string_view op) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::Ok();
  return internal_error(std::string(op) + ": kernel launch failed: " + cudaGetErrorString(error));
}

// Grid limits: x runs over tokens, y over groups of heads.
inline constexpr std::int64_t kMaxGridX = 2147483647;
inline constexpr std::int64_t kMaxGridY = 65535;

}  // namespace smla::layer_cuda
