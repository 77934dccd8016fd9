// Copies host-side attention arguments (testkit cases) to the current CUDA
// device with identical strides, and device outputs back. Shared by the GPU
// tests and the GPU benchmark. Header-only; needs the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "smla/attention.h"
#include "testkit/host_tensor.h"

namespace smla::cudatest {

inline bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

inline Device current_cuda_device() {
  int index = 0;
  check_cuda(cudaGetDevice(&index), "cudaGetDevice");
  return Device{DeviceKind::kCuda, index};
}

// A device copy of a host view: same shape, strides and bytes (padding included).
struct DeviceView {
  DeviceBuffer buffer;
  TensorView view;
};

inline DeviceView copy_to_device(const TensorView& host) {
  DeviceView result;
  result.view = host;
  if (!host.present()) return result;
  const std::size_t bytes = testkit::storage_bytes(host);
  result.buffer = DeviceBuffer(bytes);
  if (bytes > 0) check_cuda(cudaMemcpy(result.buffer.data(), host.data, bytes, cudaMemcpyHostToDevice), "copy to device");
  result.view.data = result.buffer.data();
  result.view.device = current_cuda_device();
  return result;
}

inline void copy_to_host(const DeviceView& device, const TensorView& host) {
  if (!host.present()) return;
  check_cuda(cudaMemcpy(host.data, device.view.data, testkit::storage_bytes(host), cudaMemcpyDeviceToHost),
             "copy to host");
}

// Device copies that live as long as the call's arguments that point at them.
struct DeviceViews {
  std::vector<std::unique_ptr<DeviceView>> views;

  TensorView put(const TensorView& host) {
    views.push_back(std::make_unique<DeviceView>(copy_to_device(host)));
    return views.back()->view;
  }
};

// Every tensor of a decode call on the device; outputs start as copies of the
// host outputs (poisoned by the testkit) so unwritten elements show.
struct DeviceDecodeArgs : DeviceViews {
  SparseDecodeArgs args;
  DeviceView* out = nullptr;
  DeviceView* lse = nullptr;

  explicit DeviceDecodeArgs(const SparseDecodeArgs& host) : args(host) {
    args.q = put(host.q);
    args.main_cache.pages = put(host.main_cache.pages);
    args.main_indices = put(host.main_indices);
    args.main_lengths = put(host.main_lengths);
    if (host.extra_cache.has_value()) {
      KvCacheView extra = *host.extra_cache;
      extra.pages = put(extra.pages);
      args.extra_cache = extra;
    }
    args.extra_indices = put(host.extra_indices);
    args.extra_lengths = put(host.extra_lengths);
    args.sink = put(host.sink);
    args.out = put(host.out);
    out = views.back().get();
    args.lse = put(host.lse);
    lse = views.back().get();
    args.token_order = put(host.token_order);
  }
};

struct DevicePrefillArgs : DeviceViews {
  SparsePrefillArgs args;
  DeviceView* out = nullptr;
  DeviceView* max_logits = nullptr;
  DeviceView* lse = nullptr;

  explicit DevicePrefillArgs(const SparsePrefillArgs& host) : args(host) {
    args.q = put(host.q);
    args.kv = put(host.kv);
    args.indices = put(host.indices);
    args.topk_length = put(host.topk_length);
    args.sink = put(host.sink);
    args.out = put(host.out);
    out = views.back().get();
    args.max_logits = put(host.max_logits);
    max_logits = views.back().get();
    args.lse = put(host.lse);
    lse = views.back().get();
  }
};

}  // namespace smla::cudatest
