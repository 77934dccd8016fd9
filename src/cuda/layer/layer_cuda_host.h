// Internal: host side of the CUDA layer ops (the cuda rows of smla/layer.h): the plain
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
#include "src/cuda/common/current_device.h"

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

// Every present tensor on the context's device, checked after the shape checks
// so device-free callers see the argument errors first.
using ::smla::cuda::check_on_context_device;

// The launch error of the kernels just queued on the stream (no synchronization);
// the op's front end names the op.
inline Status launch_status() {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::Ok();
  return internal_error(std::string("kernel launch failed: ") + cudaGetErrorString(error));
}

// Grid limits: x runs over tokens, y over groups of heads.
inline constexpr std::int64_t kMaxGridX = 2147483647;
inline constexpr std::int64_t kMaxGridY = 65535;

}  // namespace smla::layer_cuda
